from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from library.tiny_lm import build_tiny_lm

if TYPE_CHECKING:
    from carpool_model_server.handler_text_generation import TextGenerationHandler


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))


@pytest.fixture(scope="module")
def token_loop(tiny_lm_path: Path) -> Iterator[TextGenerationHandler]:
    """The tiny GPT-2's text-generation handler with its token loop (continuous batching)."""
    import torch

    from carpool_model_server.handler import HandlerSettings
    from carpool_model_server.handler_text_generation import TextGenerationHandler

    settings = HandlerSettings(tiny_lm_path, torch.float32, 16, {"batching": "continuous"})
    loaded = TextGenerationHandler(settings)
    loaded.load(torch.device("cpu"))
    yield loaded
    loaded.close()
