"""The CRD's rules that a built-in handler has the model it reads (`carpool.contract.generate`).

A file handler (`FILE_HANDLERS`) needs spec.model.modelPath, or weights.uri, whose file the
operator then names; a folder handler that has no model of its own needs modelPath, or
weights from storageUri or a PVC, whose mountPath the operator then names. The API server
refuses a BatchedModel that has neither, as the model server would refuse to start. A
folder handler with a model of its own (text-embedding) is refused weights.uri without
modelPath: it would serve its own model in place of the user's file. The rules sit between
two marker comments in spec's `x-kubernetes-validations`, written from
`carpool.contract.handlers`.
"""

from __future__ import annotations

import textwrap

from carpool.contract.crd import WIDTH
from carpool.contract.handlers import FILE_HANDLERS, FOLDER_HANDLERS, NEEDS_MODEL_PATH

_BEGIN = "                # Written from carpool.contract.handlers by `make generate`:"
_END = "                # (end of the generated rules)"
_ITEM = "                - "
_FIELD = "                  "


def _names(handlers: frozenset[str]) -> tuple[str, str]:
    """The handlers as a CEL list and as words (`a, b or c`)."""
    ordered = sorted(handlers)
    listed = ", ".join(f"'{name}'" for name in ordered)
    words = ordered[0] if len(ordered) == 1 else f"{', '.join(ordered[:-1])} or {ordered[-1]}"
    return f"[{listed}]", words


def model_path_rules() -> list[tuple[str, str]]:
    """(rule, message) of each rule."""
    files, file_words = _names(FILE_HANDLERS)
    folders, folder_words = _names(NEEDS_MODEL_PATH - FILE_HANDLERS)
    own, own_words = _names(FOLDER_HANDLERS - NEEDS_MODEL_PATH)
    has_path = "has(self.model.modelPath)"
    return [
        (
            f"!(self.model.handler in {files}) || {has_path} || "
            "(has(self.model.weights) && has(self.model.weights.uri))",
            f"model.handler {file_words} loads a file: set model.modelPath, or model.weights.uri "
            "to fetch one",
        ),
        (
            f"!(self.model.handler in {folders}) || {has_path} || (has(self.model.weights) && "
            "(has(self.model.weights.storageUri) || has(self.model.weights.pvc)))",
            f"model.handler {folder_words} loads the model's folder: set model.weights.storageUri "
            "or model.weights.pvc (the folder is their mountPath), or model.modelPath",
        ),
        (
            # It has a model of its own, which it would serve in place of the user's.
            f"!(self.model.handler in {own}) || {has_path} || "
            "!(has(self.model.weights) && has(self.model.weights.uri))",
            f"model.handler {own_words} loads the model's folder, not the one file weights.uri "
            "fetches: use model.weights.storageUri or model.weights.pvc, or set model.modelPath",
        ),
    ]


def with_model_path_rules(crd: str) -> str:
    """The CRD text with the lines between the markers written from the handlers."""
    lines = crd.splitlines()
    try:
        start, end = lines.index(_BEGIN), lines.index(_END)
    except ValueError:
        raise ValueError(
            f"the CRD lacks the markers {_BEGIN.strip()!r}, {_END.strip()!r}"
        ) from None
    rules: list[str] = []
    for rule, message in model_path_rules():
        rules += [f"{_ITEM}rule: >-", *_folded(rule), f"{_FIELD}fieldPath: .model.modelPath"]
        rules += [f"{_FIELD}message: >-", *_folded(message)]
    return "\n".join([*lines[: start + 1], *rules, *lines[end:]]) + "\n"


def _folded(text: str) -> list[str]:
    """A folded scalar's lines: YAML joins them with spaces again."""
    indent = _FIELD + "  "
    wrapped = textwrap.wrap(text, WIDTH - len(indent), break_on_hyphens=False)
    return [indent + line for line in wrapped]
