"""`carpool serve` exposes the sidecar's gRPC front on --grpc-port."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from support.serve import serving

from carpool.processes import free_port

tritongrpc = pytest.importorskip("tritonclient.grpc")


def test_serve_answers_triton_grpc_client() -> None:
    grpc_port = free_port()
    args = ["--handler", "toy", "--torch-threads", "1", "--port", str(free_port())]
    with serving(*args, "--grpc-port", str(grpc_port), until="ready at") as process:
        client = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        rows = np.array([[1, 2, 3, 4]], dtype=np.float32)
        tensor = tritongrpc.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        result = client.infer("toy", [tensor], client_timeout=10)
        client.close()
        np.testing.assert_array_equal(result.as_numpy("output"), 2 * rows + 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
