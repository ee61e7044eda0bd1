"""`carpool serve` exposes the sidecar's gRPC front on --grpc-port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from carpool.processes import free_port

tritongrpc = pytest.importorskip("tritonclient.grpc")


def test_serve_answers_triton_grpc_client() -> None:
    grpc_port = free_port()
    command = [sys.executable, "-m", "carpool", "serve", "--handler", "toy", "--torch-threads", "1"]
    command += ["--port", str(free_port()), "--grpc-port", str(grpc_port)]
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "ready at" in line:
                break
        client = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        rows = np.array([[1, 2, 3, 4]], dtype=np.float32)
        tensor = tritongrpc.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        result = client.infer("toy", [tensor], client_timeout=10)
        client.close()
        np.testing.assert_array_equal(result.as_numpy("output"), 2 * rows + 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
