"""The bounds of `carpool render`'s YAML reader: what a real file never reaches passes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from carpool_operator.bounded_yaml import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_DOCUMENTS,
    YamlInputError,
    load_documents,
    read_bounded,
)

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "batchedmodels.carpool.dev.yaml"
REAL_FILES = [*sorted((ROOT / "examples").glob("*.yaml")), CRD]


def nested(levels: int) -> bytes:
    return ("[" * levels + "]" * levels).encode()


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda path: path.name)
def test_real_files_load_as_pyyaml_loads_them(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) < MAX_BYTES // 16
    assert [document.value for document in load_documents(data)] == list(yaml.safe_load_all(data))


def test_each_bound_is_inclusive() -> None:
    assert load_documents(nested(MAX_DEPTH))[0].value is not None
    with pytest.raises(YamlInputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_documents(nested(MAX_DEPTH + 1))

    documents = b"---\na: 1\n" * MAX_DOCUMENTS
    assert [document.line for document in load_documents(documents)][:2] == [2, 4]
    with pytest.raises(YamlInputError, match=f"more than {MAX_DOCUMENTS} YAML documents"):
        load_documents(documents + b"---\na: 1\n")

    exactly = b"#" * (MAX_BYTES - 1) + b"\n"
    assert read_bounded(io.BytesIO(exactly)) == exactly
    with pytest.raises(YamlInputError, match=f"larger than {MAX_BYTES} bytes"):
        read_bounded(io.BytesIO(exactly + b"\n"))


def test_reading_stops_past_the_bound() -> None:
    endless = io.BytesIO(b"#" * (MAX_BYTES * 4))
    with pytest.raises(YamlInputError):
        read_bounded(endless)
    assert endless.tell() == MAX_BYTES + 1


def test_values_are_what_kubectl_reads() -> None:
    (document,) = load_documents(b"date: 2025-11-20\ntime: 2025-11-20T10:00:00Z\nn: 0x10\n")
    assert document.value == {"date": "2025-11-20", "time": "2025-11-20T10:00:00Z", "n": 16}


def test_the_bounds_are_documented() -> None:
    render_section = (ROOT / "docs" / "operator.md").read_text().split("### `carpool render`")[1]
    for bound in (f"{MAX_BYTES} bytes", f"{MAX_DOCUMENTS} YAML documents", f"{MAX_DEPTH} levels"):
        assert bound in render_section
