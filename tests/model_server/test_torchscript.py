"""The torchscript handler with a scripted module saved to a temporary file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.model_server import post_batch, run_model_server

from carpool.model_server.wire import Tensor

# TorchScript is deprecated upstream but remains the format this handler serves.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1, keepdim=True) * 3.0 - 1.0


def vector(*values: float) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.array(values, dtype=np.float32))}


async def test_scripted_module_answers_each_item(tmp_path: Path) -> None:
    model_path = tmp_path / "affine.pt"
    torch.jit.save(torch.jit.script(Affine()), str(model_path))
    with run_model_server(tmp_path, "torchscript", "--model-path", str(model_path)) as server:
        items = [vector(1, 2, 3), vector(0, 0, 0), vector(1, 2), vector(-1, -1, -1)]
        results = await post_batch(server, items)
    outputs = [r.outputs["output"].to_numpy().tolist() if r.outputs else None for r in results]
    assert outputs == [[17.0], [-1.0], None, [-10.0]]
    assert results[2].status == 400 and "shape" in str(results[2].error)
