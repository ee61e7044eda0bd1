"""The model server's domain errors, each carrying the HTTP status a caller should see.

`app.py` maps these to responses in one place; per-item errors travel inside a 200 batch
response with the same statuses.
"""

from __future__ import annotations

from pathlib import PurePath


class ServerError(Exception):
    """A request the server refuses as a whole."""

    status = 500


class BadRequest(ServerError):
    """A body that is not valid wire format."""

    status = 400


class NotReady(ServerError):
    """The model has not finished loading and warming up."""

    status = 503


class DeviceFailed(ServerError):
    """The device failed in a way no retry fixes (e.g. a poisoned CUDA context).

    Every batch from then on is refused and `/healthz` fails, so the kubelet restarts the
    container: only a new process gets a usable device.
    """

    status = 503


class InvalidItem(ValueError):
    """One item a handler refuses; its neighbours in the batch still run."""

    status = 400


class InferError(RuntimeError):
    """An item the model failed on, or a handler that broke its contract."""

    status = 500


class ConfigError(ValueError):
    """A setting that is missing or invalid; the message names the key and the value."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        shown = str(value) if isinstance(value, PurePath) else value  # as it was given
        super().__init__(f"invalid {key} {shown!r}: {reason}")
        self.key = key
        self.value = value
