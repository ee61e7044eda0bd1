"""The folder tree is the import tree: every module is found at its path, from anywhere."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("carpool", "sidecar", "model_server", "operator")


def _modules() -> list[tuple[str, Path]]:
    found = []
    for part in PARTS:
        source = ROOT / part / "src"
        for path in sorted(source.rglob("*.py")):
            names = path.relative_to(source).with_suffix("").parts
            name = ".".join(names[:-1] if names[-1] == "__init__" else names)
            found.append((name, path))
    return found


@pytest.mark.parametrize(("name", "path"), _modules(), ids=lambda value: str(value))
def test_a_module_s_import_name_is_its_path(name: str, path: Path) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve() == path.resolve()


def _from_the_root(*args: str) -> subprocess.CompletedProcess[str]:
    # As a user's shell starts Python in the checkout: the working directory first on sys.path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_standard_library_is_not_shadowed_from_the_root() -> None:
    done = _from_the_root("-c", "import operator; operator.eq; import carpool_operator")
    assert done.returncode == 0, done.stderr


def test_python_m_pytest_runs_from_the_root() -> None:
    done = _from_the_root(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/test_bisection.py"
    )
    assert done.returncode == 0, done.stdout + done.stderr
