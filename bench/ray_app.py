"""The same model behind Ray Serve's `@serve.batch`, for bench/compare.py.

Runs in its own virtual environment (`bench/compare.py --install-peers` builds it under
.cache/), with carpool installed there too: the deployment speaks the sidecar's Open
Inference Protocol JSON API through the sidecar's codec and runs carpool's handler, so only
the batching and serving machinery differs. The model runs inside the batch method, on the
replica's event loop, as Ray's batching guide writes it.

    .cache/ray-venv/bin/python bench/ray_app.py --handler text-embedding --port 8082 \
        --torch-threads 1 --max-batch-size 32 --max-wait-ms 5
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from typing import Any

import peer_model
import ray
import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from carpool.contract.wire import Item, ItemResult, Tensor
from carpool.engine.errors import SidecarError
from carpool_sidecar import oip, tensors
from carpool_sidecar.inference import InferResponse

# Requests a replica accepts at once: far above the benchmark's concurrency, so that Ray's
# own admission limit (5 by default) does not cap the batches.
MAX_ONGOING_REQUESTS = 1024


# No access log: the other variants keep none either, and a line per request costs CPU.
@serve.deployment(
    max_ongoing_requests=MAX_ONGOING_REQUESTS,
    logging_config={"enable_access_log": False, "log_level": "WARNING"},
)
class BatchedModel:
    def __init__(
        self,
        handler: str,
        model_name: str,
        device: str,
        torch_threads: int,
        max_batch_size: int,
        max_wait_ms: float,
        dtype: str,
    ) -> None:
        self.handler = peer_model.load(handler, device, torch_threads, max_batch_size, dtype)
        self.model_name = model_name
        self.infer_batch.set_max_batch_size(max_batch_size)
        self.infer_batch.set_batch_wait_timeout_s(max_wait_ms / 1000)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def infer_batch(self, items: list[Item]) -> list[ItemResult]:
        return peer_model.run(self.handler, items)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path.startswith("/v2/health/"):
            return JSONResponse({"ready": True})
        if path != f"/v2/models/{self.model_name}/infer":
            return JSONResponse({"error": f"no route {path}"}, status_code=404)
        try:
            return await self._infer(request)
        except SidecarError as error:
            return JSONResponse({"error": error.message}, status_code=error.status)

    async def _infer(self, request: Request) -> Response:
        header = request.headers.get(oip.HEADER_LENGTH)
        parsed = oip.parse_request(await request.body(), int(header) if header else None)
        columns = {tensor.name: tensors.split(tensor) for tensor in parsed.inputs}
        count = parsed.inputs[0].items
        items: list[Item] = [
            {name: parts[index] for name, parts in columns.items()} for index in range(count)
        ]
        results: list[ItemResult] = await asyncio.gather(*(self.infer_batch(i) for i in items))
        outputs: dict[str, list[Tensor]] = {}
        for result in results:
            if result.error is not None:
                return JSONResponse({"error": result.error}, status_code=result.status)
            assert result.outputs is not None
            for name, tensor in result.outputs.items():
                outputs.setdefault(name, []).append(tensor)
        stacked = [tensors.stack(name, parts) for name, parts in outputs.items()]
        (body,), headers = oip.encode_response(
            InferResponse(self.model_name, parsed.id, stacked, frozenset())
        )
        return Response(body, headers=headers)


@peer_model.serve_options
def main(served: peer_model.Served) -> None:
    """Serve one model with Ray Serve batching on 127.0.0.1 until SIGTERM."""
    device = served.device
    gpus = 1 if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()) else 0
    # Ray puts its working folder on the workers' import path; from the repository root, the
    # source folder `carpool/` would hide the installed package. Start from an empty folder.
    with tempfile.TemporaryDirectory(prefix="carpool-ray-") as folder:
        os.chdir(folder)
        _serve(served, gpus)


def _serve(served: peer_model.Served, gpus: int) -> None:
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": served.port})
    options: dict[str, Any] = {"num_gpus": gpus} if gpus else {}
    app = BatchedModel.options(ray_actor_options=options).bind(
        served.handler,
        served.model_name,
        served.device,
        served.torch_threads,
        served.max_batch_size,
        served.max_wait_ms,
        served.dtype,
    )
    serve.run(app, route_prefix="/")
    # Blocked only now, so that Ray's processes, all started by here, keep the default.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
