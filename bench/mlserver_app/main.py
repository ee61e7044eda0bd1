"""The same model behind MLServer's adaptive batching, for bench/compare.py.

Runs in its own virtual environment (`bench/compare.py --install-peers` builds it under
.cache/), with bench/ on PYTHONPATH for peer_model and this folder's runtime. MLServer
speaks the Open Inference Protocol natively: the request is the one every variant gets.
One parallel worker process runs the model, as carpool runs one model server; MLServer's
own metrics server is off (the request path keeps its metrics).

    .cache/mlserver-venv/bin/python bench/mlserver_app/main.py --handler text-embedding \
        --port 8084 --torch-threads 1 --max-batch-size 32 --max-wait-ms 5
"""

from __future__ import annotations

import asyncio

import peer_model
from mlserver import MLServer
from mlserver.settings import ModelParameters, ModelSettings, Settings

from carpool import processes


async def _serve(settings: Settings, model: ModelSettings) -> None:
    # Built inside the running loop: MLServer installs its SIGTERM handler on it.
    server = MLServer(settings)
    await server.start([model])


@peer_model.serve_options
def main(served: peer_model.Served) -> None:
    """Serve one model with MLServer adaptive batching on 127.0.0.1 until SIGTERM."""
    settings = Settings(
        host="127.0.0.1",
        http_port=served.port,
        # MLServer always serves gRPC too: on a port of its own, unused.
        grpc_port=processes.free_port(),
        metrics_endpoint=None,
        parallel_workers=1,
        debug=False,
    )
    model = ModelSettings(
        name=served.model_name,
        implementation="mlserver_app.runtime.CarpoolModel",
        max_batch_size=served.max_batch_size,
        max_batch_time=served.max_wait_ms / 1000,
        parameters=ModelParameters(
            extra={
                "handler": served.handler,
                "device": served.device,
                "torch_threads": served.torch_threads,
                "dtype": served.dtype,
            }
        ),
    )
    asyncio.run(_serve(settings, model))


if __name__ == "__main__":
    main()
