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
import socket

import click
from mlserver import MLServer
from mlserver.settings import ModelParameters, ModelSettings, Settings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _serve(settings: Settings, model: ModelSettings) -> None:
    # Built inside the running loop: MLServer installs its SIGTERM handler on it.
    server = MLServer(settings)
    await server.start([model])


@click.command()
@click.option("--handler", default="text-embedding", show_default=True)
@click.option("--model-name", default=None)
@click.option("--port", type=int, required=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--torch-threads", type=int, default=1, show_default=True)
@click.option("--max-batch-size", type=int, default=32, show_default=True)
@click.option("--max-wait-ms", type=float, default=5.0, show_default=True)
def main(
    handler: str,
    model_name: str | None,
    port: int,
    device: str,
    torch_threads: int,
    max_batch_size: int,
    max_wait_ms: float,
) -> None:
    """Serve one model with MLServer adaptive batching on 127.0.0.1 until SIGTERM."""
    settings = Settings(
        host="127.0.0.1",
        http_port=port,
        # MLServer always serves gRPC too: on a port of its own, unused.
        grpc_port=_free_port(),
        metrics_endpoint=None,
        parallel_workers=1,
        debug=False,
    )
    model = ModelSettings(
        name=model_name or handler,
        implementation="mlserver_app.runtime.CarpoolModel",
        max_batch_size=max_batch_size,
        max_batch_time=max_wait_ms / 1000,
        parameters=ModelParameters(
            extra={"handler": handler, "device": device, "torch_threads": torch_threads}
        ),
    )
    asyncio.run(_serve(settings, model))


if __name__ == "__main__":
    main()
