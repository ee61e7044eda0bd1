"""The elements of a JSON tensor's `data`, counted from its text before it is converted.

Converting JSON data makes one Python object per element and per array, so a `data` that
holds far more of them than its shape declares would cost all of them before the mismatch
showed. Here one `data` value, which msgspec has already validated as JSON, is counted with a
few passes of bytes methods (C loops, no object per element):

- an escape is a backslash and one more character, so once the escaped backslashes and
  then the escaped quotes are taken out, every quote left opens or closes a string;
- in an array of scalars and arrays, every element but the last of each non-empty array is
  followed by a comma: it holds commas + 1 - (empty arrays) scalars;
- outside strings, every `[` opens an array.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from carpool.engine.errors import BadRequest

_WHITESPACE = b" \t\n\r"
# A string once its escaped quotes are out; it becomes a lone quote, a one-character scalar.
_STRING = re.compile(rb'"[^"]*"')
# Bytes of text scanned at once for the depth of its brackets: under a MB of numpy.
_CHUNK = 1 << 16


def elements(
    name: str, datatype: str, text: bytes, expected: int, strings: bool
) -> tuple[int, int]:
    """The scalars and the arrays in `text`, a JSON value: strings when `strings` (BYTES),
    numbers or booleans otherwise; BadRequest when it holds the other kind, or objects.
    Strings are looked at one by one only when there are no more of them than `expected`
    (else their count alone is returned, with no arrays)."""
    if b"{" in text and not strings:
        raise BadRequest(f"input {name!r}: data holding objects does not fit {datatype}")
    if not strings:
        if b'"' in text:
            raise BadRequest(f"input {name!r}: data holding strings does not fit {datatype}")
        compact = text.translate(None, _WHITESPACE)
        return _scalars(compact), compact.count(b"[")
    text = _without_escapes(text)
    found = text.count(b'"') // 2
    if found > expected:
        return found, 0
    # No more strings than declared, each now one character: nothing else may stand between.
    bare = _STRING.sub(b'"', text).translate(None, _WHITESPACE)
    if bare.translate(None, b'[],"'):
        raise BadRequest(f"input {name!r}: BYTES data must be strings")
    return _scalars(bare), bare.count(b"[")


def check_arrays(name: str, shape: Sequence[int], arrays: int) -> None:
    """BadRequest when `data` nests more arrays than its shape has room for: its own nesting
    (`[[1, 2], [3, 4]]` for [2, 2]) or anything flatter, each scalar wrapped at most once
    (`[[1], [2], [3], [4]]` for [4])."""
    room, rows = 0, 1  # rows: the arrays at the current depth
    for dim in shape[:-1]:
        room += rows
        rows *= dim
    room += rows * (1 + shape[-1])
    if arrays > room:
        raise BadRequest(
            f"input {name!r}: data holds {arrays} arrays, more than its shape {list(shape)} "
            f"has room for ({room})"
        )


def outer(text: bytes, strings: bool) -> int:
    """The elements of `text`, a JSON array of scalars and arrays (of strings when
    `strings`): the commas at depth 1, plus one, in text without strings (numpy scans the
    depth of its brackets a chunk at a time)."""
    compact = _STRING.sub(b'"', _without_escapes(text)) if strings else text
    codes = np.frombuffer(compact.translate(None, _WHITESPACE), np.uint8)
    if codes.size == 2:  # "[]"
        return 0
    commas, depth = 0, 0
    for start in range(0, codes.size, _CHUNK):
        chunk = codes[start : start + _CHUNK]
        steps = (chunk == ord("[")).view(np.int8) - (chunk == ord("]")).view(np.int8)
        levels = np.cumsum(steps, dtype=np.int32) + depth
        commas += int(np.count_nonzero((chunk == ord(",")) & (levels == 1)))
        depth = int(levels[-1])
    return commas + 1


def objects(text: bytes) -> int:
    """The objects in `text`, a JSON document: the `{` outside strings."""
    return _STRING.sub(b'"', _without_escapes(text)).count(b"{")


def _without_escapes(text: bytes) -> bytes:
    """`text` with its escaped backslashes, then its escaped quotes, taken out."""
    if b"\\" in text:
        return text.replace(b"\\\\", b"").replace(b'\\"', b"")
    return text


def _scalars(compact: bytes) -> int:
    """Scalars in a JSON value without whitespace, strings or objects."""
    return compact.count(b",") + 1 - compact.count(b"[]")
