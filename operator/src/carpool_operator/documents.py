"""Which documents of a file are BatchedModels, and whether their envelope is one to render.

Every document must be a Kubernetes object (a mapping with `apiVersion` and `kind`). One of
the CRD's group or kind must be the version the CRD serves, and have a name: anything else
there is a mistake (an old apiVersion, a misspelt kind). Other objects are not carpool's to
judge and are skipped. The metadata that reaches the children (name, namespace, uid,
generation) is checked as the API server checks it; the schema checks the rest (schema.py).
"""

from __future__ import annotations

import re
from typing import Any

from carpool_operator.bounded_yaml import Document
from carpool_operator.schema import Cause, json_type, served
from carpool_operator.types import Manifest

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_MAX = 63
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    f"used for validation is '{_LABEL}')"
)
# The metadata fields that reach the children, and their JSON types.
_READ = {"namespace": "string", "uid": "string", "generation": "integer"}


class DocumentProblem(Exception):
    """Why a document is not a BatchedModel to render; `line` is where it starts."""

    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.message = message
        self.line = line


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def batched_model(document: Document) -> Manifest | None:
    """The document as a BatchedModel, None if it is some other object; else why not."""
    body = document.value
    if not isinstance(body, dict):
        found = "list" if isinstance(body, list) else json_type(body)
        raise DocumentProblem(f"not a Kubernetes object but {_a(found)}", document.line)
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if not (isinstance(api_version, str) and api_version and isinstance(kind, str) and kind):
        raise DocumentProblem("apiVersion and kind are required", document.line)
    our_version, our_kind = served()
    if (api_version, kind) != (our_version, our_kind):
        if kind != our_kind and api_version.split("/")[0] != our_version.split("/")[0]:
            return None
        known = f"carpool render knows {our_version} {our_kind}"
        raise DocumentProblem(f"{api_version} {kind} is not served: {known}", document.line)
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if name is None or name == "":
        message = "metadata.name: Required value: carpool render names the children after it"
        raise DocumentProblem(message, document.line)
    if not isinstance(name, str):
        message = f'metadata.name: Invalid value: "{json_type(name)}": must be a string'
        raise DocumentProblem(message, document.line)
    return body


def metadata_causes(body: Manifest) -> list[Cause]:
    """What the API server refuses in the metadata fields a BatchedModel's children take."""
    metadata: dict[str, Any] = body["metadata"]
    causes: list[Cause] = []
    for key, expected in _READ.items():
        value = metadata.get(key)
        if value is not None and json_type(value) != expected:
            found = json_type(value)
            message = f'Invalid value: "{found}": must be of type {expected}'
            causes.append(Cause(f"metadata.{key}", message, "FieldValueTypeInvalid"))
    namespace = metadata.get("namespace")
    if isinstance(namespace, str) and namespace:
        if len(namespace) > _LABEL_MAX:
            message = f"must be no more than {_LABEL_MAX} characters"
            causes.append(Cause("metadata.namespace", f'Invalid value: "{namespace}": {message}'))
        if not re.fullmatch(_LABEL, namespace):
            message = f'Invalid value: "{namespace}": {_LABEL_MESSAGE}'
            causes.append(Cause("metadata.namespace", message))
    return causes
