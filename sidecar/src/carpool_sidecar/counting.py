"""The elements of a JSON tensor's `data`, counted from its text before it is converted.

Converting JSON data makes one Python object per element, so a `data` that holds far more
elements than its shape declares would cost all of them before the mismatch showed. Here
one `data` value, which msgspec has already validated as JSON, is counted with a few passes
of bytes methods (C loops, no object per element):

- an escape is a backslash and one more character, so once the escaped backslashes and
  then the escaped quotes are taken out, every quote left opens or closes a string;
- in an array of scalars and arrays, every element but the last of each non-empty array is
  followed by a comma: it holds commas + 1 - (empty arrays) scalars.
"""

from __future__ import annotations

import re

from carpool.engine.errors import BadRequest

_WHITESPACE = b" \t\n\r"
# A string once its escaped quotes are out; it becomes a lone quote, a one-character scalar.
_STRING = re.compile(rb'"[^"]*"')


def elements(name: str, datatype: str, text: bytes, expected: int, strings: bool) -> int:
    """The scalars in `text`, a JSON value: strings when `strings` (BYTES), numbers or
    booleans otherwise; BadRequest when it holds the other kind, or objects. Strings are
    looked at one by one only when there are no more of them than `expected`."""
    if b"{" in text and not strings:
        raise BadRequest(f"input {name!r}: data holding objects does not fit {datatype}")
    if not strings:
        if b'"' in text:
            raise BadRequest(f"input {name!r}: data holding strings does not fit {datatype}")
        return _scalars(text.translate(None, _WHITESPACE))
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    found = text.count(b'"') // 2
    if found > expected:
        return found
    # No more strings than declared, each now one character: nothing else may stand between.
    bare = _STRING.sub(b'"', text).translate(None, _WHITESPACE)
    if bare.translate(None, b'[],"'):
        raise BadRequest(f"input {name!r}: BYTES data must be strings")
    return _scalars(bare)


def _scalars(compact: bytes) -> int:
    """Scalars in a JSON value without whitespace, strings or objects."""
    return compact.count(b",") + 1 - compact.count(b"[]")
