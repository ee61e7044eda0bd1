"""The same model behind BentoML's adaptive batching, for bench/compare.py.

Runs in its own virtual environment (`bench/compare.py --install-peers` builds it under
.cache/), with bench/ on PYTHONPATH for peer_model. `main` puts the settings in the
environment and starts `bentoml serve` on this module's service: one worker whose batchable
API takes the request's input tensors as its batched list, so BentoML's dispatcher joins
the tensors of up to `--max-batch-size` requests into one call, which runs them through
carpool's handler as one batch. The request is the Open Inference Protocol JSON one every
variant gets (one input tensor; a model with several inputs is not served); the answer is
the response object in a list of one, as BentoML splits a batched list.

BentoML has no batch window to set: its dispatcher learns how long to wait from the
batches it has timed. Its `max_latency_ms` is a deadline past which queued requests fail
with 503, not a wait; it keeps BentoML's default, far above any latency measured here.

    .cache/bentoml-venv/bin/python bench/bentoml_app.py --handler text-embedding \
        --port 8085 --torch-threads 1 --max-batch-size 32
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import bentoml
import peer_model

# Settings from `main` to the service, which `bentoml serve` imports in its own process.
ENV = {
    "handler": "CARPOOL_BENCH_HANDLER",
    "model_name": "CARPOOL_BENCH_MODEL_NAME",
    "device": "CARPOOL_BENCH_DEVICE",
    "torch_threads": "CARPOOL_BENCH_TORCH_THREADS",
    "max_batch_size": "CARPOOL_BENCH_MAX_BATCH_SIZE",
    "dtype": "CARPOOL_BENCH_DTYPE",
}
HANDLER = os.environ.get(ENV["handler"], "text-embedding")
MODEL_NAME = os.environ.get(ENV["model_name"], HANDLER)
MAX_BATCH_SIZE = int(os.environ.get(ENV["max_batch_size"], "32"))


# One worker, as carpool runs one model server; no access log, as the other variants keep none.
@bentoml.service(workers=1, logging={"access": {"enabled": False}})
class CarpoolModel:
    def __init__(self) -> None:
        self.handler = peer_model.load(
            HANDLER,
            os.environ.get(ENV["device"], "auto"),
            int(os.environ.get(ENV["torch_threads"], "1")),
            MAX_BATCH_SIZE,
            os.environ.get(ENV["dtype"], "fp32"),
        )

    @bentoml.api(
        route=f"/v2/models/{MODEL_NAME}/infer", batchable=True, max_batch_size=MAX_BATCH_SIZE
    )
    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # One tensor per request here; a request of several rows is several items.
        per_request = [peer_model.items([tensor]) for tensor in inputs]
        results = peer_model.run(self.handler, [item for items in per_request for item in items])
        answers = []
        for items in per_request:
            mine, results = results[: len(items)], results[len(items) :]
            answers.append({"model_name": MODEL_NAME, "outputs": peer_model.outputs(mine)})
        return answers


@peer_model.serve_options
def main(served: peer_model.Served) -> None:
    """Serve one model with BentoML adaptive batching on 127.0.0.1 until SIGTERM."""
    settings = {
        "handler": served.handler,
        "model_name": served.model_name,
        "device": served.device,
        "torch_threads": str(served.torch_threads),
        "max_batch_size": str(served.max_batch_size),
        "dtype": served.dtype,
    }
    os.environ.update({ENV[key]: value for key, value in settings.items()})
    os.environ["BENTOML_DO_NOT_TRACK"] = "true"
    here = Path(__file__).resolve()
    # `python -m bentoml`, not the venv's `bentoml` script: its first line names the folder the
    # venv was built in, which need not be where it is now.
    command = [sys.executable, "-m", "bentoml", "serve", f"{here.stem}:CarpoolModel"]
    command += [
        "--working-dir",
        str(here.parent),
        "--host",
        "127.0.0.1",
        "--port",
        str(served.port),
    ]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
