"""A model server whose batch answers a test scripts: what a broken or hostile one might send.

    with scripted_model_server(tmp_path, answer) as url:   # unix://...
        ...  # a sidecar pointed at `url` sees a ready toy model

It serves `/readyz` and `/metadata` (the toy model's) over HTTP on a Unix socket, and batches
over the framed socket beside it; `answer(items)` returns the msgpack document to send back,
as a dict, so a test can put anything in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
from aiohttp import web

from carpool.contract import frames, wire
from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.loop_thread import LoopThread

Answer = Callable[[list[dict[str, wire.Tensor]]], dict[str, Any]]

TOY = ModelMetadata(
    name="toy",
    platform="scripted",
    inputs=(TensorSpec("input", "FP32", (4,)),),
    outputs=(TensorSpec("output", "FP32", (4,)),),
    max_batch_size=8,
)


def toy_results(items: list[dict[str, wire.Tensor]]) -> list[dict[str, Any]]:
    """What the toy model answers (2 * input + 1), as the wire's result maps."""
    results = []
    for item in items:
        row = item["input"].to_numpy() * 2 + 1
        output = wire.Tensor.from_numpy(row)
        data = {"datatype": output.datatype, "shape": list(output.shape), "data": output.data}
        results.append({"outputs": {"output": data}})
    return results


@contextmanager
def scripted_model_server(folder: Path, answer: Answer) -> Iterator[str]:
    """Serves on a thread of its own, so that the test may block (as `run_sidecar` does)."""
    http_socket = folder / "scripted.sock"
    thread = LoopThread("scripted-model-server")
    try:
        stop = thread.submit(_serve(http_socket, answer)).result(10)
        try:
            yield f"unix://{http_socket}"
        finally:
            thread.submit(stop()).result(10)
    finally:
        thread.stop()


async def _serve(http_socket: Path, answer: Answer) -> Callable[[], Coroutine[Any, Any, None]]:
    """Start both listeners; returns what stops them."""

    async def ready(_: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def metadata(_: web.Request) -> web.Response:
        return web.json_response(TOY.encode())

    app = web.Application()
    app.router.add_get("/readyz", ready)
    app.router.add_get("/metadata", metadata)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(http_socket)).start()

    async def batches(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readexactly(frames.HEADER.size)
                length, request_id, code = frames.HEADER.unpack(head)
                payload = await reader.readexactly(length)
                if code != frames.BATCH:
                    continue
                body = msgpack.packb(answer(wire.decode_request(payload)), use_bin_type=True)
                writer.write(frames.header(len(body), request_id, frames.OK) + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(
        batches, path=frames.socket_for(http_socket), limit=wire.MAX_BODY_BYTES
    )

    async def stop() -> None:
        server.close()
        await runner.cleanup()

    return stop
