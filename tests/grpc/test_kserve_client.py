"""KServe's own gRPC client (InferenceGRPCClient) against a real sidecar."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.sidecar import run_pair

if importlib.util.find_spec("kserve") is None:
    pytest.skip("the kserve package is not installed", allow_module_level=True)

CLIENT = Path(__file__).resolve().parent / "kserve_client.py"


def test_kserve_grpc_client_raw_and_typed(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy") as pair:
        env = dict(os.environ)
        done = subprocess.run(
            [sys.executable, str(CLIENT), pair.sidecar.grpc, "toy"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["live"] and report["ready"] and report["model_ready"]
    rows = [[1, 2, 3, 4], [0.5, -1, 0, 8]]
    for form in ("raw", "typed"):
        assert report[form]["id"] == f"k-{form}"
        assert report[form]["outputs"] == {"output": [[2 * v + 1 for v in row] for row in rows]}
