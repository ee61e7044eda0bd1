from __future__ import annotations

from pathlib import Path

import pytest
from library.tiny_lm import build_tiny_lm


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))
