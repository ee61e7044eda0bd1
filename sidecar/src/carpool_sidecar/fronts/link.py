"""Frames between a front process and the batching process, over one end of a socket pair.

A frame is `carpool.contract.frames`' header (payload length, id, code) and a payload. The
ids pair answers with requests, as on the model server's framed socket; both ends are this
sidecar's own processes, so payloads that only they read are pickled.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import socket
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

from carpool.contract import frames, wire
from carpool.contract.metadata import ModelMetadata
from carpool.contract.wire import Item, Tensor
from carpool.engine.errors import SidecarError
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings

# Batching process -> front.
CONFIG = 1  # the pickled SidecarConfig, first of all
STATE = 2  # a pickled State, whenever it changes
RESULT = 3  # a submit's results (wire.encode_response)
ERROR = 4  # a submit's SidecarError (`encode_error`)
METRICS = 5  # a scrape's Prometheus text
COLLECT = 6  # send your metric families
CLOSE = 7  # stop accepting; payload: the drain's grace in seconds (msgpack)
# Front -> batching process.
SUBMIT = 10  # a request's items (`encode_submit`)
CANCEL = 11  # the submit with this id is no longer wanted
SCRAPE = 12  # the whole pod's metrics, please
FAMILIES = 13  # the pickled metric families, answering COLLECT
CLOSED = 14  # no longer accepting
GENERATED = 15  # a generate answer that came whole: pickled (arrival, generation.Ending)


@dataclass(frozen=True, slots=True)
class State:
    """What a front must know of the batching process to answer as it would."""

    ready: bool
    metadata: ModelMetadata | None
    settings: BatchingSettings
    draining: bool
    stopping: bool
    broken: str | None


class Submit(NamedTuple):
    """A request's items and what the engine's `submit` takes with them (a tuple: one is
    built for every request, on both sides)."""

    items: Sequence[Item]
    key: BatchKey
    deadline: float
    priority: int
    lengths: list[int] | None
    nbytes: int
    arrived_at: float | None


class Link:
    """One end of the socket pair: frames out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._out: list[bytes | memoryview] = []

    def send(self, code: int, frame_id: int, payload: bytes | memoryview = b"") -> None:
        """Frames sent in one turn of the loop (a batch's results, requests that came
        together) leave in one write."""
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out += (frames.header(len(payload), frame_id, code), payload)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if not self._writer.is_closing():
            self._writer.writelines(out)

    async def frames(self) -> AsyncGenerator[tuple[int, int, bytes], None]:
        """(code, id, payload) until the other end closes."""
        try:
            while True:
                length, frame_id, code = frames.HEADER.unpack(
                    await self._reader.readexactly(frames.HEADER.size)
                )
                yield code, frame_id, await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def close(self) -> None:
        self._writer.close()


async def connect(sock: socket.socket) -> Link:
    """A Link over a connected socket (one end of a socket pair)."""
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=wire.MAX_BODY_BYTES)
    return Link(reader, writer)


@functools.lru_cache(maxsize=1024)
def _key_bytes(key: BatchKey) -> bytes:
    return pickle.dumps(key)


@functools.lru_cache(maxsize=1024)
def _key(data: bytes) -> BatchKey:
    key = pickle.loads(data)
    assert isinstance(key, BatchKey)
    return key


def encode_submit(submit: Submit) -> bytes:
    items = [
        [[name, t.datatype, t.shape, t.data] for name, t in item.items()] for item in submit.items
    ]
    fields = (submit.deadline, submit.priority, submit.lengths, submit.nbytes, submit.arrived_at)
    return msgpack.packb([items, _key_bytes(submit.key), *fields], use_bin_type=True)


def decode_submit(payload: bytes) -> Submit:
    items, key, deadline, priority, lengths, nbytes, arrived_at = msgpack.unpackb(payload)
    # Checked by the front that built them, as the model server checks them again.
    tensors = [
        {name: Tensor(datatype, tuple(shape), data) for name, datatype, shape, data in item}
        for item in items
    ]
    return Submit(tensors, _key(key), deadline, priority, lengths, nbytes, arrived_at)


def encode_error(error: SidecarError) -> bytes:
    fields = [error.status, error.message, error.headers, error.close_connection]
    return msgpack.packb([*fields, error.rejected_reason])


def decode_error(payload: bytes) -> SidecarError:
    """The error as the batching process raised it: its status, message, headers, reason."""
    status, message, headers, close_connection, reason = msgpack.unpackb(payload)
    error = SidecarError(message, headers=headers, close_connection=close_connection)
    error.status, error.rejected_reason = status, reason
    return error
