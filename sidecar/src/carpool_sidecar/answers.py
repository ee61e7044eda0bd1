"""What answers may hold: bytes per answer, and bytes of answers built and not yet sent.

An answer's size follows from its outputs' datatypes and element counts (and, for BYTES,
their lengths), so it is known before the answer is built: from the model's metadata and the
request's item count when the outputs have fixed shapes, from the results otherwise. An
answer over `max_answer_bytes` is refused (413) rather than built. Every answer being built
or written holds its size in the sidecar's budget until its last byte has gone to the
socket; past `max_unsent_bytes`, answers are refused (503 with Retry-After), so callers who
never read what they asked for cannot pile answers up in the sidecar's memory.

A streamed answer comes in frames that wait in the sidecar until its caller has taken the
one before: each frame holds its bytes in the same budget from its arrival until it has
been handed to the socket, or the stream ends. A frame that finds the budget spent cuts its
stream (the caller gets an error, the model server a cancel), as a whole answer would be
refused: many callers who read their streams slowly cannot hold more than the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from prometheus_client import Gauge

from carpool.contract.metadata import ModelMetadata
from carpool.contract.wire import BYTES, NUMPY_DTYPES, Tensor
from carpool.engine.errors import PayloadTooLarge, Unavailable
from carpool_sidecar.tensors import element_count

# Longest JSON text of one element, its comma included: "-9223372036854775808," for INT64,
# "-2.2250738585072014e-308," for FP64; FP16 and BF16 are written as float32.
JSON_WIDTHS = {
    "BOOL": 6,
    "INT8": 5,
    "INT16": 7,
    "INT32": 12,
    "INT64": 21,
    "UINT8": 4,
    "UINT16": 6,
    "UINT32": 11,
    "UINT64": 21,
    "FP16": 16,
    "BF16": 16,
    "FP32": 16,
    "FP64": 25,
}
# A BYTES element in JSON: each byte as at most a 6-character escape, with quotes and comma.
JSON_BYTE_WIDTH = 6
JSON_STRING_EXTRA = 3
# Bytes of binary BYTES before each element: its length.
LENGTH_PREFIX = 4
# An answer refused for want of room: answers being written finish or are cut within seconds.
BUSY_RETRY_AFTER_S = 1


def output_bytes(datatype: str, elements: int, element_bytes: int, binary: bool) -> int:
    """The most bytes one output takes in an answer: `elements` of `datatype`, whose BYTES
    elements hold `element_bytes` together, raw (`binary`) or as JSON."""
    if datatype == BYTES:
        if binary:
            return element_bytes + LENGTH_PREFIX * elements
        return JSON_BYTE_WIDTH * element_bytes + JSON_STRING_EXTRA * elements
    if binary:
        return NUMPY_DTYPES[datatype].itemsize * elements
    return JSON_WIDTHS[datatype] * elements


def fixed_answer_bytes(
    metadata: ModelMetadata, names: Sequence[str], binary: frozenset[str], items: int
) -> int:
    """The most bytes the outputs of fixed shape and numeric datatype take for `items`."""
    total = 0
    for name in names:
        spec = metadata.output(name)
        if spec is not None and spec.datatype != BYTES and not spec.variable:
            elements = items * element_count(spec.shape)
            total += output_bytes(spec.datatype, elements, 0, name in binary)
    return total


def answer_bytes(parts: Mapping[str, Sequence[Tensor]], binary: frozenset[str]) -> int:
    """The most bytes the answer takes, from the items' outputs, before they are joined."""
    total = 0
    for name, tensors in parts.items():
        # One pass, no generators: this runs for every answer.
        elements = element_bytes = 0
        for tensor in tensors:
            elements += tensor.element_count
            if isinstance(tensor.data, list):
                element_bytes += sum(map(len, tensor.data))
        total += output_bytes(tensors[0].datatype, elements, element_bytes, name in binary)
    return total


class AnswerBudget:
    """The sidecar's bound on each answer and on the answers it holds unsent."""

    def __init__(
        self, max_answer_bytes: int, max_unsent_bytes: int, gauge: Gauge | None = None
    ) -> None:
        self.max_answer_bytes = max_answer_bytes
        self.max_unsent_bytes = max_unsent_bytes
        self.unsent = 0
        if gauge is not None:
            # Read when scraped: setting it (a lock) twice per answer cost more.
            gauge.set_function(lambda: self.unsent)

    def check(self, nbytes: int, limit: int) -> None:
        """PayloadTooLarge when an answer of `nbytes` is over this front's `limit` or the
        sidecar's bound per answer."""
        most = min(limit, self.max_answer_bytes)
        if nbytes > most:
            raise PayloadTooLarge(
                f"the answer would take up to {nbytes} bytes, more than the limit of {most}; "
                "ask for fewer items or outputs, or for binary outputs"
            )

    def hold(self, nbytes: int, limit: int) -> Held:
        """Room for an answer of `nbytes`, until `Held.release`."""
        self.check(nbytes, limit)
        self.reserve(nbytes)
        return Held(self, nbytes)

    def reserve(self, nbytes: int) -> None:
        """Count `nbytes` more unsent; Unavailable when that would pass the bound."""
        if self.unsent + nbytes > self.max_unsent_bytes:
            raise Unavailable(
                f"{self.unsent} bytes of answers are waiting to be sent, the limit is "
                f"{self.max_unsent_bytes}; retry shortly",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        self.unsent += nbytes


class HeldFrames:
    """One stream's frames that have come and are not yet sent, in the budget, in order."""

    def __init__(self, budget: AnswerBudget) -> None:
        self._budget = budget
        self._sizes: deque[int] = deque()

    def arrived(self, nbytes: int) -> None:
        """Hold a frame of `nbytes` that has come; Unavailable when the budget is spent."""
        self._budget.reserve(nbytes)
        self._sizes.append(nbytes)

    def sent(self) -> None:
        """The oldest frame held has gone to the socket."""
        if self._sizes:
            self._budget.unsent -= self._sizes.popleft()

    def release(self) -> None:
        """The stream has ended: its frames held, sent or not, hold nothing more."""
        self._budget.unsent -= sum(self._sizes)
        self._sizes.clear()


class Held:
    """One answer's share of the budget; released once, however often `release` is called."""

    def __init__(self, budget: AnswerBudget, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes

    def release(self) -> None:
        self._budget.unsent -= self.nbytes
        self.nbytes = 0
