"""The baseline carpool is compared with: one forward pass per HTTP request, no batching.

What a user writes before carpool: an aiohttp server that runs the model on each request's
own items as they come. It speaks the same Open Inference Protocol JSON API as the sidecar
(parsed and encoded by the sidecar's own codec) and runs the model through the same code
path as carpool's model server (handler, one worker thread, `--torch-threads`), so the only
difference left is batching across requests and the hop between the two processes.

    python bench/unbatched_server.py --handler text-embedding --port 8081 --torch-threads 1
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import click
from aiohttp import web
from model_setup import build_handler

from carpool.comma_list import CommaList, KeyValue
from carpool.contract.wire import Item, Tensor
from carpool.engine.errors import BadRequest, ModelError, SidecarError
from carpool_model_server.config import DTYPES
from carpool_model_server.errors import ConfigError
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner
from carpool_sidecar import oip, tensors
from carpool_sidecar.inference import InferResponse

RUNNER = web.AppKey("runner", Runner)
MODEL_NAME = web.AppKey("model_name", str)
READY = web.AppKey("ready", asyncio.Event)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_to_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SidecarError as error:
        return web.json_response({"error": error.message}, status=error.status)


async def infer(request: web.Request) -> web.Response:
    if request.match_info["name"] != request.app[MODEL_NAME]:
        return web.json_response({"error": "unknown model"}, status=404)
    if not request.app[READY].is_set():
        return web.json_response({"error": "model is loading"}, status=503)
    header = request.headers.get(oip.HEADER_LENGTH)
    parsed = oip.parse_request(await request.read(), int(header) if header else None)
    counts = {tensor.items for tensor in parsed.inputs}
    if len(counts) != 1:
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(counts)}")
    columns = {tensor.name: tensors.split(tensor) for tensor in parsed.inputs}
    items: list[Item] = [
        {name: parts[index] for name, parts in columns.items()} for index in range(counts.pop())
    ]
    results = await request.app[RUNNER].run(items)
    outputs: dict[str, list[Tensor]] = {}
    for result in results:
        if result.error is not None:
            raise ModelError(result.error, result.status)
        assert result.outputs is not None
        for name, tensor in result.outputs.items():
            outputs.setdefault(name, []).append(tensor)
    stacked = [tensors.stack(name, parts) for name, parts in outputs.items()]
    # JSON outputs only (no binary_data_output): the body is one part.
    (body,), headers = oip.encode_response(
        InferResponse(request.app[MODEL_NAME], parsed.id, stacked, frozenset())
    )
    return web.Response(body=body, headers=headers)


async def ready(request: web.Request) -> web.Response:
    status = 200 if request.app[READY].is_set() else 503
    return web.json_response({"ready": status == 200}, status=status)


def build_app(runner: Runner, model_name: str, torch_threads: int | None) -> web.Application:
    app = web.Application(middlewares=[errors_to_json], client_max_size=64 * 1024**2)
    app[RUNNER] = runner
    app[MODEL_NAME] = model_name
    app[READY] = asyncio.Event()

    async def load(app: web.Application) -> AsyncIterator[None]:
        # Listen at once; answer ready only after load and a one-item warm-up.
        async def start() -> None:
            await runner.load(torch_threads, [1])
            app[READY].set()

        task = asyncio.create_task(start())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        runner.close()

    app.cleanup_ctx.append(load)
    app.router.add_post("/v2/models/{name}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/health/live", ready)
    return app


@click.command()
@click.option("--handler", default="text-embedding", show_default=True)
@click.option("--handler-options", type=CommaList(KeyValue()), default=(), help="e.g. preset=fast")
@click.option("--model-name", default=None, help="[default: the handler name]")
@click.option("--model-path", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--port", type=int, required=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--torch-threads", type=int, default=None, help="torch intra-op threads.")
@click.option("--dtype", type=click.Choice(DTYPES), default="fp32", show_default=True)
def main(
    handler: str,
    handler_options: tuple[tuple[str, str], ...],
    model_name: str | None,
    model_path: Path | None,
    port: int,
    device: str,
    torch_threads: int | None,
    dtype: str,
) -> None:
    """Serve one model without batching, on 127.0.0.1."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    name = model_name or handler
    try:
        # One item at a time: the handler never sees a batch larger than one request.
        model, resolved = build_handler(handler, device, dtype, 64, handler_options, model_path)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    runner = Runner(model, resolved, ModelMetrics.create(name), 64)
    app = build_app(runner, name, torch_threads)
    # run_app turns SIGINT/SIGTERM into a clean exit that runs cleanup_ctx.
    web.run_app(
        app, host="127.0.0.1", port=port, print=None, access_log=None, handler_cancellation=True
    )


if __name__ == "__main__":
    main()
