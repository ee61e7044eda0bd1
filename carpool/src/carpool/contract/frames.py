"""The framed stream between the sidecar and the model server, beside its HTTP socket.

One long-lived Unix-socket connection carries many batches at once. Each frame is a fixed
header and a payload; a request id pairs every answer with its batch, so answers may come
in any order and a caller who gave up is simply not waited for.

Header (10 bytes, big-endian): payload length u32, request id u32, code u16.

Sidecar -> server: code BATCH, payload a wire request (`wire.encode_request`); or code
CANCEL, empty payload: the batch with that id is no longer wanted.
Server -> sidecar: code 200, payload a wire response (`wire.encode_response`); or any
other code, an HTTP status for the whole batch, payload a UTF-8 message. Every BATCH gets
exactly one answer unless it is cancelled first.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Final

HEADER: Final = struct.Struct(">IIH")
BATCH: Final = 0
CANCEL: Final = 1
OK: Final = 200
# Request ids wrap around within u32; far more batches than can ever be in flight at once.
ID_MODULUS: Final = 2**32
# The framed socket lies next to the model server's HTTP socket, named after it.
SOCKET_SUFFIX: Final = ".frames"


def socket_for(http_socket: str | Path) -> str:
    """The framed socket that a model server listening on `http_socket` serves."""
    return f"{http_socket}{SOCKET_SUFFIX}"


def header(length: int, request_id: int, code: int) -> bytes:
    return HEADER.pack(length, request_id, code)
