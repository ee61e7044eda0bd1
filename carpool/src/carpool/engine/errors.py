"""Domain errors of the sidecar, each with the HTTP status its caller sees.

The data plane and the batching engine raise these; `carpool_sidecar.app` is the one place
that turns them into `{"error": ...}` responses.
"""

from __future__ import annotations

# Not an HTTP status: the client went away before its answer (nginx's convention).
CLIENT_GONE = 499
# What a caller hears of a bug in the sidecar; the details go to its log.
INTERNAL_MESSAGE = "internal error; see the sidecar log"
# The longest message an error carries, in UTF-8 bytes. A message may hold what a caller or
# the model server sent (a name, a model's own words), and goes to every caller of a batch;
# over gRPC it travels percent-encoded in a trailer, which clients refuse past 8 to 16 KiB.
MAX_MESSAGE_BYTES = 1024
# The header that tells a refused caller how many seconds to wait before trying again.
RETRY_AFTER = "Retry-After"


class SidecarError(Exception):
    """An error a caller should see, with its HTTP status."""

    status = 500
    # What the status means to a caller, for the OpenAPI document.
    description = "A bug in the sidecar (details in its log), or the model failed on an item."
    # The `carpool_rejected_total` reason this error counts as, if it is a rejection.
    rejected_reason: str | None = None
    # Whether the answer closes the connection: the rest of its body is never read.
    close_connection = False

    def __init__(
        self,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        close_connection: bool | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        message = _bounded(message)
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})
        if retry_after_s is not None:
            self.headers[RETRY_AFTER] = str(retry_after_s)
        if close_connection is not None:
            self.close_connection = close_connection


class BadRequest(SidecarError):
    status = 400
    description = "Malformed request, or an item the model refused as invalid."
    rejected_reason = "bad_request"


class BodyTimeout(SidecarError):
    status = 408
    description = (
        "The body stopped arriving for --body-timeout-seconds, or was incomplete at the deadline."
    )
    rejected_reason = "body_timeout"
    close_connection = True


class ModelNotFound(SidecarError):
    status = 404
    description = "Unknown model name or version."


class PayloadTooLarge(SidecarError):
    status = 413
    description = "Body above --max-body-bytes, or more items than maxQueueItems or more "
    "bytes than maxQueueBytes."
    rejected_reason = "too_large"


class QueueFull(SidecarError):
    status = 429
    description = "The queue is full; nothing was queued. Retry-After says when to retry."
    rejected_reason = "queue_full"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


# The `carpool_rejected_total` reasons of Late: predicted past latencyObjectiveMs, past the
# request's own deadline, or pushed past either by a request of higher priority.
LATE_REASONS = ("objective", "cannot_meet_deadline", "displaced")


class Late(QueueFull):
    """Refused at once because it is predicted to be answered too late (latencyObjectiveMs)."""

    description = (
        "Predicted to be answered after latencyObjectiveMs or its own deadline, or pushed "
        "past them in the queue by a request of higher priority. Retry-After says when the "
        "queue ahead of it has likely drained."
    )

    def __init__(self, message: str, retry_after_s: int, reason: str) -> None:
        super().__init__(message, retry_after_s)
        self.rejected_reason = reason


class ModelError(SidecarError):
    """An error the model server reported for one item, with the status it chose."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class BadModelResponse(SidecarError):
    """The model server answered, but not with what the wire format promises."""

    status = 502
    description = "The model server answered with a malformed batch."


class Unavailable(SidecarError):
    """The model server cannot be reached, is not ready, or the sidecar is draining."""

    status = 503
    description = "The model server is not ready or failed the batch, or the sidecar stops."


class ModelUnreachable(Unavailable):
    """No connection to the model server: it is down or restarting."""


class DeadlineExceeded(SidecarError):
    status = 504
    description = "The request's deadline passed."
    rejected_reason: str = "deadline"


def _bounded(message: str) -> str:
    """`message`, cut to MAX_MESSAGE_BYTES of UTF-8 (on a character boundary) if longer."""
    if len(message) <= MAX_MESSAGE_BYTES // 4:  # short enough in any encoding
        return message
    encoded = message.encode(errors="surrogatepass")
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    cut = encoded[:MAX_MESSAGE_BYTES].decode(errors="ignore")
    return f"{cut}... ({len(encoded)} bytes in all)"
