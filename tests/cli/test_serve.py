"""`carpool serve`: both processes locally, a short demo load, a report, exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest
from support.model_server import SUPPORT_DIR
from support.serve import serving
from support.sidecar import v2_body

from carpool.processes import free_port

REPO = Path(__file__).resolve().parents[2]


def test_serve_demo_load_reports_batching() -> None:
    # The console script from the repository root, as a user runs it: the children it starts
    # must not import our operator/ folder as the stdlib's operator.
    command = [str(Path(sys.executable).parent / "carpool"), "serve", "--handler", "toy"]
    command += ["--torch-threads", "1", "--port", str(free_port())]
    command += ["--grpc-port", str(free_port()), "--demo-load", "--demo-seconds", "1.5"]
    env = dict(os.environ)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(0 failed)" in done.stdout
    mean = re.search(r"mean batch size: ([\d.]+)", done.stdout)
    assert mean is not None, done.stdout
    # 32 clients against one model: requests share batches.
    assert float(mean.group(1)) > 1, done.stdout


@pytest.mark.parametrize("fronts", ["1", "2"])
def test_serve_stops_both_children_on_sigterm(fronts: str) -> None:
    port = free_port()
    args = ["--handler", "toy", "--torch-threads", "1", "--port", str(port)]
    args += ["--grpc-port", str(free_port()), "--max-batch-size", "4"]
    # With front processes the sidecar's own process holds their sockets: ready as before,
    # and none is left listening after the stop.
    args += ["--front-processes", fronts]
    with serving(*args, until="ready at") as process:
        url = f"http://127.0.0.1:{port}/v2/models/toy/infer"
        body = orjson.dumps(v2_body([[1, 1, 1, 1]]))
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as reply:
            assert reply.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=2)


def test_serve_stopped_while_the_model_loads_exits_0() -> None:
    # A SIGTERM that lands before `carpool serve` saw the pair ready (a test or a person
    # quicker than its poll, or a model that takes minutes to load) is still a clean stop.
    args = ["--handler", "model_handlers:SlowLoadHandler"]
    args += ["--port", str(free_port()), "--grpc-port", str(free_port())]
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_LOAD_S": "120"}
    with serving(*args, until="carpool_model_server listening on", env=env) as process:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 0, stderr
        assert "stopped before the model was ready" in stderr


def test_serve_given_one_port_for_http_and_grpc_says_so_in_one_line() -> None:
    port = str(free_port())
    command = [sys.executable, "-m", "carpool", "serve", "--handler", "toy"]
    done = subprocess.run(
        [*command, "--port", port, "--grpc-port", port], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"carpool: --grpc-port {port} is --port too; give each its own"
    ]
