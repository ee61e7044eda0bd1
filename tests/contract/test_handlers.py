"""The built-in handlers, named once (`carpool.contract.handlers`) and described everywhere."""

from __future__ import annotations

from pathlib import Path

import yaml

from carpool.contract.handlers import BUILTIN_HANDLERS

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_describe_every_built_in_handler() -> None:
    built_ins = (ROOT / "docs/model-server.md").read_text().split("### Built-ins")[1]
    for name in BUILTIN_HANDLERS:
        assert f"| `{name}` |" in built_ins, f"docs/model-server.md lacks the built-in {name}"


def test_the_crd_names_every_built_in_handler() -> None:
    crd = yaml.safe_load((ROOT / "crds/batchedmodels.carpool.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    description = spec["properties"]["model"]["properties"]["handler"]["description"]
    assert all(name in description for name in BUILTIN_HANDLERS), description
