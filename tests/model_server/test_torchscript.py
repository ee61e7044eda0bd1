"""The torchscript handler with a scripted module saved to a temporary file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.model_server import post_batch, run_model_server

from carpool.contract.wire import Tensor

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


class Project(torch.nn.Module):
    """Takes items of shape [2, 3] only: the matmul fails on any other last dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight).flatten(1)


def save_project(tmp_path: Path) -> Path:
    model_path = tmp_path / "project.pt"
    torch.jit.save(torch.jit.script(Project()), str(model_path))
    return model_path


async def test_example_shape_warms_up_every_size_before_ready(tmp_path: Path) -> None:
    model_path = save_project(tmp_path)
    args = ["--model-path", str(model_path), "--example-shape", "2,3", "--warmup-sizes", "1,4"]
    with run_model_server(tmp_path, "torchscript", *args) as server:
        log_when_ready = server.log()  # read as soon as /readyz first answered 200
        matrix = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
        results = await post_batch(server, [{"input": Tensor.from_numpy(matrix)}])
    for size in (1, 4):
        assert f"warm-up at batch size {size} took" in log_when_ready, log_when_ready
    assert results[0].outputs is not None
    assert results[0].outputs["output"].to_numpy().tolist() == [6.0, 15.0]


def test_a_shape_the_model_cannot_take_fails_the_load(tmp_path: Path) -> None:
    model_path = save_project(tmp_path)
    args = ["--model-path", str(model_path), "--example-shape", "4", "--warmup-sizes", "1"]
    with run_model_server(tmp_path, "torchscript", *args, wait_ready=False) as server:
        assert server.process.wait(60) == 1
        assert "warm-up batch of 1 failed" in server.log(), server.log()


def test_without_example_shape_warm_up_is_skipped_and_says_so(tmp_path: Path) -> None:
    model_path = save_project(tmp_path)
    with run_model_server(tmp_path, "torchscript", "--model-path", str(model_path)) as server:
        log_when_ready = server.log()
    assert "--example-shape" in log_when_ready and "warm-up batch" not in log_when_ready
