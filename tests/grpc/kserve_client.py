"""KServe's InferenceGRPCClient against a sidecar, in a process of its own.

kserve and tritonclient both register the `inference.*` protobuf names in the default
descriptor pool, so they cannot share the test process. Usage: kserve_client.py TARGET
MODEL; prints one JSON document of what the client got.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest

ROWS = np.array([[1, 2, 3, 4], [0.5, -1, 0, 8]], dtype=np.float32)


async def main(target: str, model: str) -> None:
    client = InferenceGRPCClient(target, retries=0)
    report: dict[str, object] = {
        "live": await client.is_server_live(),
        "ready": await client.is_server_ready(),
        "model_ready": await client.is_model_ready(model),
    }
    for form, binary in (("raw", True), ("typed", False)):
        tensor = InferInput("input", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS, binary_data=binary)
        request = InferRequest(model_name=model, infer_inputs=[tensor], request_id=f"k-{form}")
        response = await client.infer(request)
        report[form] = {
            "id": response.id,
            "outputs": {output.name: output.as_numpy().tolist() for output in response.outputs},
        }
    await client.close()
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
