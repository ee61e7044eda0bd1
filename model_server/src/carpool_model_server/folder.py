"""The JSON files of a model's folder (configs that transformers and sentence-transformers
write beside the weights), read without loading the model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Mapping[str, Any]:
    """A model folder's JSON file as an object; empty when there is no such file."""
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} holds no JSON object")
    return loaded
