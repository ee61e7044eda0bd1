"""The README's own-model example: the file it shows whole, served by its own command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest

from carpool import processes

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, re.S | re.M)


def command_line(start: str) -> str:
    """The README's shell line that starts with `start`, continuation lines joined."""
    for block in blocks("sh"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.startswith(start):
                return line.split("  #")[0]
    raise AssertionError(f"no command starting {start!r} in README.md")


def test_the_readme_shows_the_example_file_whole() -> None:
    assert (REPO / "examples" / "my_models.py").read_text() in blocks("python")


def test_the_readme_serves_its_example_model_as_it_says(tmp_path: Path) -> None:
    serve = shlex.split(command_line("PYTHONPATH=examples .venv/bin/carpool serve"))
    curl = shlex.split(command_line("curl -s localhost:8080/v2/models/scaler/infer"))
    variable, venv_carpool, *args = serve
    assert venv_carpool == ".venv/bin/carpool"
    port = processes.free_port()
    # From the repository root, as a user's shell runs it.
    env = dict(os.environ)
    env[variable.split("=")[0]] = variable.split("=")[1]
    command = [str(Path(sys.executable).parent / "carpool"), *args, "--port", str(port)]
    command += ["--grpc-port", str(processes.free_port()), "--torch-threads", "1"]
    process = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        ready = url + "/v2/health/ready"
        processes.wait_ready([process], lambda: processes.http_ok(ready), 60, "carpool serve")
        # curl's -d is a POST of that body.
        body = curl[curl.index("-d") + 1].encode()
        request = urllib.request.Request(url + curl[2].removeprefix("localhost:8080"), data=body)
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer = orjson.loads(reply.read())
    finally:
        assert processes.stop(process, 30) == 0
    (score,) = answer["outputs"]
    assert score["name"] == "score" and score["data"] == pytest.approx([10.0, 4.0])
