"""Handlers for tests, loaded by a model server subprocess as `model_handlers:Class`.

Pass `env={"PYTHONPATH": str(SUPPORT_DIR)}` to `run_model_server` so the subprocess finds
this module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.handler import Prepared, require_input
from carpool_model_server.handler_toy import ToyHandler


class SlowLoadHandler(ToyHandler):
    """The toy model, with a load that takes CARPOOL_TEST_LOAD_S seconds (default 2)."""

    def load(self, device: torch.device) -> None:
        time.sleep(float(os.environ.get("CARPOOL_TEST_LOAD_S", "2")))
        super().load(device)


class SlowInferHandler(ToyHandler):
    """The toy model, with each batch taking CARPOOL_TEST_INFER_S seconds (default 0.2); a
    batch's start creates the file CARPOOL_TEST_INFER_STARTED names, where one is named."""

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        if started := os.environ.get("CARPOOL_TEST_INFER_STARTED"):
            Path(started).touch()
        time.sleep(float(os.environ.get("CARPOOL_TEST_INFER_S", "0.2")))
        return super().infer(batch)

    def example_item(self) -> Item | None:
        return None  # slow warm-up batches would only delay readiness


class WrongLengthHandler(ToyHandler):
    """The toy model, answering one result fewer than it was given (none for one item)."""

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return super().postprocess(outputs)[:-1]

    def example_item(self) -> Item | None:
        return None  # warm-up would fail on the wrong length


class FailingLoadHandler(ToyHandler):
    """A model whose weights cannot be found."""

    def load(self, device: torch.device) -> None:
        raise FileNotFoundError("no weights here")


class WideHandler(ToyHandler):
    """The toy model's arithmetic over rows of any length (`input` FP32 [-1]): a few items
    can carry, and be answered with, many megabytes."""

    metadata = Metadata(
        platform="carpool_wide",
        inputs=(TensorSpec("input", "FP32", (-1,)),),
        outputs=(TensorSpec("output", "FP32", (-1,)),),
    )

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        # The sidecar batches rows of one length together.
        rows = [require_input(item, self.metadata.inputs[0]).to_numpy() for item in items]
        return Prepared(torch.from_numpy(np.stack(rows)), len(rows), {})

    def example_item(self) -> Item | None:
        return None
