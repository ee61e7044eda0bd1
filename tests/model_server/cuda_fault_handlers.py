"""A handler that simulates a poisoned CUDA context on CPU, loaded by a model server
subprocess as `cuda_fault_handlers:PoisonedContextHandler`.

Pass `env={"PYTHONPATH": str(Path(__file__).parent)}` to `run_model_server`.
"""

from __future__ import annotations

import torch

from carpool_model_server.handler_toy import ToyHandler


class PoisonedContextHandler(ToyHandler):
    """The toy model, until an item holding NaN trips a simulated device-side assert; from
    then on every batch fails, as every kernel launch does on a poisoned CUDA context."""

    poisoned = False

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        if torch.isnan(batch).any():
            self.poisoned = True
        if self.poisoned:
            raise torch.AcceleratorError("CUDA error: device-side assert triggered")
        return super().infer(batch)
