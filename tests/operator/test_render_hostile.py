"""`carpool render -f` on hostile or careless files: one line, exit code 2, never a traceback.

Each file is refused before the work it would cause (an alias bomb is never expanded, a
huge file never parsed), with one `Error: FILE...: PROBLEM` line on stderr and nothing on
stdout. Files that rendered before still render.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from carpool_operator.bounded_yaml import MAX_BYTES, MAX_DEPTH, MAX_DOCUMENTS

ROOT = Path(__file__).resolve().parents[2]


def carpool_render(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "carpool", "render", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


def model(name: str = "m", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": {"model": {"handler": "toy"}, **spec},
    }


def text(body: Any) -> bytes:
    return yaml.safe_dump(body).encode()


# Ten levels of ten: 10**10 strings once expanded. Under spec.affinity (free-form, copied into
# the Deployment) nothing prunes it, so printing it would never end.
_BOMB = ["apiVersion: carpool.dev/v1alpha1", "kind: BatchedModel", "metadata: {name: bomb}"]
_BOMB += ["spec:", "  model: {handler: toy}", "  affinity:", '    l0: &l0 ["lol"]']
_BOMB += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 11)]
BOMB = ("\n".join(_BOMB) + "\n").encode()

NO_NAME = model()
NO_NAME["metadata"] = {"namespace": "ml"}
NO_METADATA = model()
del NO_METADATA["metadata"]
NUMBER_NAME = model()
NUMBER_NAME["metadata"] = {"name": 42}
NO_KIND = model()
del NO_KIND["kind"], NO_KIND["apiVersion"]
NAMES_CHILDREN = "carpool render names the children after it"
CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}

# name: (file content, what the one line says besides the file's name)
HOSTILE: dict[str, tuple[bytes, str]] = {
    "alias-bomb": (BOMB, "line 7, column 9: YAML anchors and aliases are not accepted (&l0)"),
    "anchor-alone": (
        b"apiVersion: carpool.dev/v1alpha1\nkind: BatchedModel\nmetadata: &m {name: a}\n",
        "line 3, column 11: YAML anchors and aliases are not accepted (&m)",
    ),
    "deep-nesting": (b"a: " + b"[" * 5000, f"nested deeper than {MAX_DEPTH} levels"),
    "too-large": (
        b"# a comment line to pad the file\n" * (MAX_BYTES // 32),
        f"larger than {MAX_BYTES} bytes",
    ),
    "too-many-documents": (
        b"".join(text(model(f"m{i}")) + b"---\n" for i in range(MAX_DOCUMENTS + 1)),
        f"more than {MAX_DOCUMENTS} YAML documents",
    ),
    "binary": (bytes(range(256)) * 4, "not UTF-8 text: byte 0x80 at offset 128"),
    "control-characters": (b"kind: Batched\x00Model\n", "not YAML"),
    "not-yaml": (b"kind: BatchedModel\nspec: {model: [1, 2\n", "not YAML"),
    "python-tag": (b"kind: !!python/object/apply:os.system [echo]\n", "not YAML"),
    "duplicate-key": (
        text(model()) + b"spec: {model: {handler: toy}, replicas: 3}\n",
        'line 8, column 1: not YAML: found duplicate key "spec"',
    ),
    "huge-integer": (
        b"kind: BatchedModel\nreplicas: " + b"9" * 5000 + b"\n",
        "line 2, column 11: not YAML: an integer of 5000 digits",
    ),
    "empty-file": (b"", "no BatchedModel in it"),
    "only-comments": (b"# nothing here\n---\n", "no BatchedModel in it"),
    "only-other-objects": (text(CONFIG_MAP), "no BatchedModel in it"),
    "scalar-document": (b"just some words\n", "line 1: not a Kubernetes object but a string"),
    "list-document": (text([model()]), "line 1: not a Kubernetes object but a list"),
    "no-kind": (text(NO_KIND), "line 1: apiVersion and kind are required"),
    "unknown-version": (
        text({**model(), "apiVersion": "carpool.dev/v9"}),
        "line 1: carpool.dev/v9 BatchedModel is not served: carpool render knows "
        "carpool.dev/v1alpha1 BatchedModel",
    ),
    "misspelt-kind": (
        text({**model(), "kind": "BatchModel"}),
        "line 1: carpool.dev/v1alpha1 BatchModel is not served",
    ),
    "other-group": (text({**model(), "apiVersion": "apps/v1"}), "apps/v1 BatchedModel"),
    "missing-name": (text(NO_NAME), f"line 1: metadata.name: Required value: {NAMES_CHILDREN}"),
    "missing-metadata": (text(NO_METADATA), "line 1: metadata.name: Required value"),
    "number-name": (
        text(NUMBER_NAME),
        'line 1: metadata.name: Invalid value: "integer": must be a string',
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_bad_file_is_one_line(tmp_path: Path, case: str) -> None:
    content, problem = HOSTILE[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(content)
    result = carpool_render("-f", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout == ""
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"Error: {path}: "), lines[0]
    assert problem in lines[0], lines[0]


@pytest.mark.parametrize(
    ("name", "make", "problem"),
    [
        ("missing.yaml", lambda path: None, "cannot read it: No such file or directory"),
        ("folder", lambda path: path.mkdir(), "cannot read it: Is a directory"),
    ],
    ids=["missing", "directory"],
)
def test_a_file_that_cannot_be_read_is_one_line(
    tmp_path: Path, name: str, make: Callable[[Path], None], problem: str
) -> None:
    path = tmp_path / name
    make(path)
    result = carpool_render("-f", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"Error: {path}: {problem}"]


def test_standard_input_is_bounded_too() -> None:
    result = carpool_render("-f", "-", stdin=BOMB)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: <stdin>: line 7, column 9: YAML anchors")


def test_problems_of_several_documents_are_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_bytes(text(NO_NAME) + b"---\n" + text({**model(), "apiVersion": "carpool.dev/v9"}))
    result = carpool_render("-f", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"Error: {path}: line 1: metadata.name: Required value: {NAMES_CHILDREN}",
        f"Error: {path}: line 9: carpool.dev/v9 BatchedModel is not served: carpool render "
        "knows carpool.dev/v1alpha1 BatchedModel",
    ]


def test_a_stream_of_objects_renders_its_batched_models(tmp_path: Path) -> None:
    """What worked before still does: several BatchedModels, other objects skipped."""
    stream = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}]
    stream += [model("first"), None, model("second", replicas=2)]
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump_all(stream))
    result = carpool_render("-f", str(path))
    assert result.returncode == 0, result.stderr
    deployments = [
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all(result.stdout)
        if doc["kind"] == "Deployment"
    ]
    assert deployments == ["first", "second"]


RFC_1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


@pytest.mark.parametrize(
    ("metadata", "line"),
    [
        (
            {"namespace": "Machine Learning"},
            f'metadata.namespace: Invalid value: "Machine Learning": {RFC_1123_LABEL}',
        ),
        (
            {"namespace": "n" * 64},
            "metadata.namespace: Invalid value: "
            + f'"{"n" * 64}": must be no more than 63 characters',
        ),
        ({"namespace": 5}, 'metadata.namespace: Invalid value: "integer": must be of type string'),
        (
            {"generation": "x"},
            'metadata.generation: Invalid value: "string": must be of type integer',
        ),
        ({"uid": {"a": 1}}, 'metadata.uid: Invalid value: "object": must be of type string'),
    ],
    ids=["namespace", "long-namespace", "number-namespace", "generation", "uid"],
)
def test_the_metadata_render_reads_is_checked(
    tmp_path: Path, metadata: dict[str, Any], line: str
) -> None:
    """The fields of metadata that reach the children, as the API server checks them."""
    body = model("meta")
    body["metadata"].update(metadata)
    path = tmp_path / "meta.yaml"
    path.write_bytes(text(body))
    result = carpool_render("-f", str(path))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"meta: {line}"]
