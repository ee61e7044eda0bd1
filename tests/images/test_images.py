"""Each image's install step, run in a virtualenv as CI has no Docker daemon.

`scripts/install-image.sh PART` is what the Dockerfile's build stage runs; here it installs
into a fresh virtualenv, and the result is checked as the image would be used: its part's
subcommands run, the other parts' are absent, and the operator and the sidecar carry no torch.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install-image.sh"
# part -> (the subcommands its image runs, those it must not have)
COMMANDS = {
    "operator": (("operator", "render"), ("sidecar", "model-server")),
    "sidecar": (("sidecar",), ("operator", "model-server")),
    "model-server": (("model-server", "infer"), ("operator", "sidecar")),
}


# What the Dockerfile copies into its build stage (.dockerignore lets only these in).
CONTEXT = ("carpool", "sidecar", "model_server", "operator", "crds", "scripts")
CONTEXT_FILES = ("constraints-dev.txt",)


def _build_context(folder: Path) -> Path:
    """A copy of what `docker build` sees: the install leaves no build/ in the checkout."""
    skip = shutil.ignore_patterns(".venv", "build", "*.egg-info", "__pycache__")
    for name in CONTEXT:
        shutil.copytree(REPO / name, folder / name, symlinks=True, ignore=skip)
    for name in CONTEXT_FILES:
        shutil.copy2(REPO / name, folder / name)
    return folder


def _size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("part", sorted(COMMANDS))
def test_an_image_installs_its_part_alone(part: str, tmp_path: Path) -> None:
    venv = tmp_path / part
    context = _build_context(tmp_path / "context")
    done = subprocess.run(
        [str(context / INSTALL.relative_to(REPO)), part, str(venv)],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    carpool = str(venv / "bin" / "carpool")
    present, absent = COMMANDS[part]
    for command in present:
        ran = subprocess.run([carpool, command, "--help"], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
    for command in absent:
        ran = subprocess.run([carpool, command, "--help"], capture_output=True, text=True)
        assert ran.returncode == 2 and "is not installed" in ran.stderr, ran.stderr
    python = str(venv / "bin" / "python")
    has_torch = subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    assert has_torch == (part == "model-server")
    if part == "model-server":
        # The weights fetcher runs from the model's image.
        fetcher = [python, "-m", "carpool.storage", "--help"]
        assert subprocess.run(fetcher, capture_output=True).returncode == 0
    # Installed, not linked to the checkout: the image's build stage is thrown away.
    assert not list(venv.glob("lib/python*/site-packages/__editable__*")), "editable install"
    print(f"{part}: {_size_mib(venv):.0f} MiB installed")
