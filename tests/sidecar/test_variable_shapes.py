"""Variable-shape numeric items through a real sidecar and torchscript model server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import torch
from support.model_server import http_get
from support.sidecar import metric, run_pair

# TorchScript is deprecated upstream but remains the format this handler serves.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Total(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1, keepdim=True)


async def test_items_of_different_shapes_are_batched_apart(tmp_path: Path) -> None:
    model_path = tmp_path / "total.pt"
    torch.jit.save(torch.jit.script(Total()), str(model_path))
    # Fixed dispatch with a long window: all three requests are queued together.
    sidecar_args = ("--dispatch", "fixed", "--max-wait-ms", "300", "--max-batch-size", "8")
    model_args = ("--model-path", str(model_path), "--torch-threads", "1")
    with run_pair(
        tmp_path, "torchscript", *sidecar_args, model_args=model_args, model="total"
    ) as pair:
        status, body = http_get(pair.model_server, "/metadata")
        assert status == 200 and orjson.loads(body)["pads_variable_dims"] is False
        sidecar = pair.sidecar
        url = f"{sidecar.url}/v2/models/total/infer"
        rows = [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0], [4.0, 5.0, 6.0]]

        async def send(http: aiohttp.ClientSession, row: list[float]) -> tuple[int, Any]:
            tensor = {"name": "input", "datatype": "FP32", "shape": [1, len(row)], "data": row}
            async with http.post(url, json={"inputs": [tensor]}) as reply:
                return reply.status, await reply.json(content_type=None)

        async with aiohttp.ClientSession() as http:
            answers = await asyncio.gather(*(send(http, row) for row in rows))
        assert [status for status, _ in answers] == [200, 200, 200], answers
        totals = [body["outputs"][0]["data"] for _, body in answers]
        assert totals == [[6.0], [15.0], [15.0]]
        # One batch per shape: the two rows of 3 together, the row of 5 alone.
        assert metric(sidecar, "carpool_batch_size_count") == 2
        assert metric(sidecar, "carpool_batch_size_sum") == 3
