"""YAML that nobody vouched for, bounded before the work it causes.

`carpool render -f` reads whatever file it is handed. An alias stands for a copy of what its
anchor names, so a few hundred bytes of anchors can stand for billions of values ("billion
laughs"); deep nesting exhausts Python's recursion; a huge file takes as long to parse as it
is large. So, before anything is built from a file:

- at most `MAX_BYTES` are read, and a file with more is refused unparsed;
- the bytes must be UTF-8 text;
- the parser's events are checked first (by libyaml where PyYAML has it): no anchor and no
  alias, at most `MAX_DOCUMENTS` documents, no collection nested deeper than `MAX_DEPTH`;
- only then are the documents built, by PyYAML's safe constructors, with three changes
  toward what kubectl reads: a timestamp stays a string, a key repeated in one mapping is an
  error, and so is an integer too long for Python to convert.

A BatchedModel is about a kilobyte, nested a dozen levels deep; the bounds leave room for
many of them, and for the other objects of a manifest stream, in one file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any

import yaml
from yaml.constructor import ConstructorError

# libyaml parses about ten times faster than PyYAML's own parser; both give the same events.
try:
    from yaml import CSafeLoader as _Parser
except ImportError:  # a PyYAML built without libyaml
    from yaml import SafeLoader as _Parser  # type: ignore[assignment]

MAX_BYTES = 1024 * 1024
MAX_DOCUMENTS = 100
MAX_DEPTH = 64


class YamlInputError(Exception):
    """Why a file is refused; `where` is its line and column (1-based) when one is to blame."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column

    @property
    def where(self) -> str:
        if self.line is None:
            return ""
        return f"line {self.line}" + (f", column {self.column}" if self.column else "")


@dataclass(frozen=True)
class Document:
    """One YAML document: the line it starts on (1-based) and its value."""

    line: int
    value: Any


class _Loader(_Parser):
    """The safe loader, with what kubectl does differently from YAML 1.1."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode):
                if (key.tag, key.value) in seen:
                    problem = f'found duplicate key "{key.value}"'
                    raise ConstructorError(None, None, problem, key.start_mark)
                seen.add((key.tag, key.value))
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            value: int = super().construct_yaml_int(node)
        except ValueError:  # more digits than int() converts
            digits = sum(character.isdigit() for character in node.value)
            raise ConstructorError(
                None, None, f"an integer of {digits} digits", node.start_mark
            ) from None
        return value

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        # Kubernetes reads YAML into JSON, where a timestamp is a string (metav1.Time parses
        # it later), so a date in a label or a variable stays as written.
        return str(self.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def read_bounded(stream: IO[bytes]) -> bytes:
    """At most `MAX_BYTES` from `stream`; more is an error, and nothing past it is read."""
    data = stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlInputError(f"larger than {MAX_BYTES} bytes, the most carpool render reads")
    return data


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        byte = data[error.start]
        raise YamlInputError(f"not UTF-8 text: byte 0x{byte:02x} at offset {error.start}") from None


def _at(message: str, mark: Any) -> YamlInputError:
    """An error at a parser's mark (0-based line and column), if it has one."""
    if mark is None:
        return YamlInputError(message)
    return YamlInputError(message, mark.line + 1, mark.column + 1)


def _refusal(error: yaml.YAMLError) -> YamlInputError:
    if isinstance(error, yaml.reader.ReaderError):  # a character YAML forbids, e.g. NUL
        return YamlInputError(f"not YAML: character #x{error.character:04x}: {error.reason}")
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    return _at("not YAML: " + " ".join(str(problem).split()), mark)


def _check_events(text: str) -> None:
    """Refuse anchors, aliases, too many documents and too deep nesting, before building."""
    depth = documents = 0
    for event in yaml.parse(text, Loader=_Loader):
        mark: Any = event.start_mark
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _at(f"YAML anchors and aliases are not accepted ({sign}{anchor})", mark)
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > MAX_DOCUMENTS:
                raise _at(f"more than {MAX_DOCUMENTS} YAML documents", mark)
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _at(f"nested deeper than {MAX_DEPTH} levels", mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_documents(data: bytes) -> list[Document]:
    """The documents of a file read with `read_bounded`; empty documents are left out."""
    text = _decode(data)
    documents: list[Document] = []
    try:
        _check_events(text)
        loader = _Loader(text)
        try:
            while loader.check_node():
                node = loader.get_node()
                if node is None:
                    break
                value = loader.construct_document(node)
                if value is not None:
                    documents.append(Document(node.start_mark.line + 1, value))
        finally:
            loader.dispose()
    except yaml.YAMLError as error:
        raise _refusal(error) from None
    return documents
