"""Protocol-neutral inference request and response, shared by the v2 and v1 codecs."""

from __future__ import annotations

from dataclasses import dataclass

from carpool_sidecar.answers import Held
from carpool_sidecar.tensors import RequestTensor

# The sidecar serves one version of its model; both protocols name it.
MODEL_VERSION = "1"


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    # Its own `binary_data`; None: as the request's `binary_data_output` says.
    binary: bool | None


@dataclass(frozen=True, slots=True)
class InferRequest:
    inputs: list[RequestTensor]
    id: str | None = None
    # None: every output of the model, in the form `binary_output` says.
    outputs: list[RequestedOutput] | None = None
    binary_output: bool = False
    priority: int = 0
    # The caller's own deadline; only ever shortens the configured timeout.
    timeout_ms: float | None = None


@dataclass(frozen=True, slots=True)
class InferResponse:
    model_name: str
    id: str | None
    outputs: list[RequestTensor]
    binary: frozenset[str]  # names of outputs sent as raw bytes after the JSON header
    # Its room in the answer budget, released by the front once the answer is sent.
    held: Held | None = None
