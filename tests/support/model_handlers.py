"""Handlers for tests, loaded by a model server subprocess as `model_handlers:Class`.

Pass `env={"PYTHONPATH": str(SUPPORT_DIR)}` to `run_model_server` so the subprocess finds
this module.
"""

from __future__ import annotations

import os
import time

import torch

from carpool.contract.wire import Item, Tensor
from carpool_model_server.handler_toy import ToyHandler


class SlowLoadHandler(ToyHandler):
    """The toy model, with a load that takes CARPOOL_TEST_LOAD_S seconds (default 2)."""

    def load(self, device: torch.device) -> None:
        time.sleep(float(os.environ.get("CARPOOL_TEST_LOAD_S", "2")))
        super().load(device)


class SlowInferHandler(ToyHandler):
    """The toy model, with each batch taking CARPOOL_TEST_INFER_S seconds (default 0.2)."""

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
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
