"""carpool's model and codec as the peer apps (LitServe, MLServer, BentoML) run them.

Each peer parses the request body itself (its framework does), hands over the Open Inference
Protocol JSON input tensors as plain values, and batches items its own way; from there on,
what runs is carpool's: the sidecar's tensor codec splits each request into items, and the
handler's preprocess, forward pass and postprocess run a batch exactly as carpool's model
server does. Only the serving and batching machinery differs between the variants.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import torch
from model_setup import build_handler

from carpool.contract.wire import Item, ItemResult, Tensor
from carpool.engine.errors import BadRequest
from carpool_model_server.config import DTYPES
from carpool_model_server.handler import AnyHandler
from carpool_sidecar import tensors

JsonTensor = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Served:
    """What a peer app serves, and how it batches."""

    handler: str
    model_name: str  # in URLs; the handler's name unless given
    port: int
    device: str
    torch_threads: int
    max_batch_size: int
    max_wait_ms: float
    dtype: str  # fp32 | fp16 | bf16, as the model server's --dtype


# The model's folder or file and the handler's own options reach `load` through the
# environment, which every peer's worker processes inherit, whatever channel the app uses for
# the rest.
MODEL_PATH_ENV = "CARPOOL_BENCH_MODEL_PATH"
OPTIONS_ENV = "CARPOOL_BENCH_HANDLER_OPTIONS"


def serve_options(main: Callable[[Served], None]) -> click.Command:
    """The command line every peer app takes, as bench/servers.py passes it."""

    def command(
        model_name: str | None, model_path: str | None, handler_options: str | None, **options: Any
    ) -> None:
        if model_path:
            os.environ[MODEL_PATH_ENV] = model_path
        if handler_options:
            os.environ[OPTIONS_ENV] = handler_options
        main(Served(model_name=model_name or options["handler"], **options))

    for option in reversed(
        (
            click.option("--handler", default="text-embedding", show_default=True),
            click.option("--model-name", default=None),
            click.option("--model-path", default=None),
            click.option("--handler-options", default=None, help="key=value,..."),
            click.option("--port", type=int, required=True),
            click.option("--device", default="auto", show_default=True),
            click.option("--torch-threads", type=int, default=1, show_default=True),
            click.option("--max-batch-size", type=int, default=32, show_default=True),
            click.option("--max-wait-ms", type=float, default=5.0, show_default=True),
            click.option("--dtype", type=click.Choice(DTYPES), default="fp32", show_default=True),
        )
    ):
        command = option(command)
    return click.command(help=main.__doc__)(command)


def load(
    handler_name: str, device: str, torch_threads: int, max_batch_size: int, dtype: str
) -> AnyHandler:
    """The handler, loaded on `device` (auto: the first GPU if any) in `dtype`, with
    `torch_threads`."""
    torch.set_num_threads(torch_threads)
    path = os.environ.get(MODEL_PATH_ENV)
    pairs = [pair.partition("=") for pair in os.environ.get(OPTIONS_ENV, "").split(",") if pair]
    options = [(key, value) for key, _, value in pairs]
    handler, resolved = build_handler(
        handler_name,
        device,
        dtype,
        max_batch_size,
        options,
        Path(path) if path else None,
    )
    with torch.inference_mode():
        handler.load(resolved)
    return handler


def items(inputs: Sequence[JsonTensor]) -> list[Item]:
    """One item per row of the request's input tensors (name, datatype, shape, data)."""
    columns: dict[str, list[Tensor]] = {}
    for raw in inputs:
        name, datatype, shape = raw["name"], raw["datatype"], tuple(raw["shape"])
        data = tensors.from_json(name, datatype, shape, raw["data"])
        columns[name] = tensors.split(tensors.RequestTensor(name, datatype, shape, data))
    counts = {len(parts) for parts in columns.values()}
    if len(counts) != 1:
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(counts)}")
    return [
        {name: parts[index] for name, parts in columns.items()} for index in range(counts.pop())
    ]


def run(handler: AnyHandler, batch: Sequence[Item]) -> list[ItemResult]:
    """One batch through the model: a result per item, a rejected item failed alone."""
    with torch.inference_mode():
        prepared = handler.preprocess(list(batch))
        outputs: list[dict[str, Tensor]] = []
        if prepared.batch is not None:
            outputs = handler.postprocess(handler.infer(prepared.batch))
    answers = iter(outputs)
    return [
        ItemResult.failed(prepared.rejected[index], 400)
        if index in prepared.rejected
        else ItemResult(outputs=next(answers))
        for index in range(len(batch))
    ]


def outputs(results: Sequence[ItemResult]) -> list[dict[str, Any]]:
    """The JSON output tensors of a request from its items' results, batch dimension first."""
    by_name: dict[str, list[Tensor]] = {}
    for result in results:
        if result.error is not None:
            raise BadRequest(result.error)
        assert result.outputs is not None
        for name, tensor in result.outputs.items():
            by_name.setdefault(name, []).append(tensor)
    stacked = [tensors.stack(name, parts) for name, parts in by_name.items()]
    return [_json(tensor) for tensor in stacked]


def _json(tensor: tensors.RequestTensor) -> dict[str, Any]:
    # Plain lists: the peers' JSON encoders take no numpy arrays.
    values = tensors.json_values(tensor)
    data = values if isinstance(values, list) else values.tolist()
    return {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
        "data": data,
    }
