"""The same model behind LitServe's dynamic batching, for bench/compare.py.

Runs in its own virtual environment (`bench/compare.py --install-peers` builds it under
.cache/), with bench/ on PYTHONPATH for peer_model. LitServe parses the request in its API
server process and queues it to one inference worker, which decodes each request into
carpool items, batches up to `--max-batch-size` of them or what arrived within
`--max-wait-ms` of the first, and runs carpool's handler on the batch. It answers the same
Open Inference Protocol JSON request at the same path as the other variants.

    .cache/litserve-venv/bin/python bench/litserve_app.py --handler text-embedding \
        --port 8083 --torch-threads 1 --max-batch-size 32 --max-wait-ms 5
"""

from __future__ import annotations

from typing import Any

import litserve
import peer_model

from carpool.contract.wire import Item, ItemResult


class CarpoolModel(litserve.LitAPI):  # type: ignore[misc]
    """One request of one item at a time in, one batch of items through the model."""

    def __init__(
        self,
        handler: str,
        model_name: str,
        device: str,
        torch_threads: int,
        dtype: str,
        **batching: Any,
    ) -> None:
        super().__init__(api_path=f"/v2/models/{model_name}/infer", **batching)
        self.handler_name = handler
        self.model_name = model_name
        self.device_name = device
        self.torch_threads = torch_threads
        self.dtype = dtype

    def setup(self, device: str) -> None:
        self.handler = peer_model.load(
            self.handler_name,
            self.device_name,
            self.torch_threads,
            self.max_batch_size,
            self.dtype,
        )

    # LitServe reads the annotations of `request` and of encode_response's return to build
    # its route: none means the body parsed as JSON in, a response built from a dict out.
    def decode_request(self, request, **_: Any) -> list[Item]:  # type: ignore[no-untyped-def]
        return peer_model.items(request["inputs"])

    def batch(self, inputs: list[list[Item]]) -> list[list[Item]]:
        return inputs

    def predict(self, requests: list[list[Item]], **_: Any) -> list[list[ItemResult]]:
        # Requests of several items are batched whole; each gets its own results back.
        results = peer_model.run(self.handler, [item for items in requests for item in items])
        answers: list[list[ItemResult]] = []
        for items in requests:
            answers.append(results[: len(items)])
            results = results[len(items) :]
        return answers

    def unbatch(self, output: list[list[ItemResult]]) -> list[list[ItemResult]]:
        return output

    def encode_response(self, output: list[ItemResult], **_: Any):  # type: ignore[no-untyped-def]
        return {"model_name": self.model_name, "outputs": peer_model.outputs(output)}


@peer_model.serve_options
def main(served: peer_model.Served) -> None:
    """Serve one model with LitServe batching on 127.0.0.1 until SIGTERM."""
    device = served.device
    api = CarpoolModel(
        served.handler,
        served.model_name,
        device,
        served.torch_threads,
        served.dtype,
        max_batch_size=served.max_batch_size,
        batch_timeout=served.max_wait_ms / 1000,
    )
    accelerator = "cpu" if device == "cpu" else "cuda" if device.startswith("cuda") else "auto"
    # One inference worker and one API server process, as carpool has one model server
    # worker behind one sidecar.
    server = litserve.LitServer(api, accelerator=accelerator, devices=1, workers_per_device=1)
    server.run(
        host="127.0.0.1",
        port=served.port,
        num_api_servers=1,
        generate_client_file=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
