"""A pod that asked for a GPU but sees none stops at once and says why."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from carpool_model_server.device import GpuMissing, require_cuda
from carpool_model_server.termination import write_termination_message


def test_auto_with_a_required_gpu_and_no_cuda_exits_at_once(tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    termination_log.touch()  # the kubelet creates it; the server only writes into it
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable, "-m", "carpool", "model-server",
            "--handler", "toy", "--port", "0", "--device", "auto",
            "--require-gpu", "--termination-log", str(termination_log),
        ],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "a GPU is required (--require-gpu) but no CUDA device is visible" in done.stderr
    # It stops before loading anything or opening a port: importing torch is the only wait.
    assert "listening" not in done.stderr
    assert elapsed < 60
    message = termination_log.read_text()
    assert message.startswith("a GPU is required") and "CUDA" in message


def test_a_cuda_build_without_a_device_points_at_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(GpuMissing, match="device plugin and runtimeClassName"):
        require_cuda("cuda:0")


def test_cpu_device_contradicts_a_required_gpu() -> None:
    with pytest.raises(GpuMissing, match="--device is cpu"):
        require_cuda("cpu")


def test_a_visible_device_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    require_cuda("auto")


def test_termination_message_replaces_the_file_only_where_it_exists(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    write_termination_message("gone", missing)
    assert not missing.exists()

    present = tmp_path / "termination-log"
    present.write_text("an older, longer message")
    write_termination_message("x" * 5000, present)
    assert present.read_text() == "x" * 4096
