"""What each route of the sidecar's HTTP API takes and answers, as data.

`app.py` binds each operation to its path and handler; `openapi.py` renders the table into
the OpenAPI document. Error statuses come from the exception classes the route can raise
(`errors.py`), so a status documented here is one the code has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from carpool.engine.errors import (
    BadModelResponse,
    BadRequest,
    BodyTimeout,
    DeadlineExceeded,
    Late,
    ModelNotFound,
    PayloadTooLarge,
    QueueFull,
    SidecarError,
    Unavailable,
)
from carpool_sidecar import bodies
from carpool_sidecar.headers import TIMEOUT_HEADER
from carpool_sidecar.inference import MODEL_VERSION
from carpool_sidecar.oip import HEADER_LENGTH


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    location: str  # "path" or "header"
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True, slots=True)
class Operation:
    summary: str
    # The body of a 200 answer: a type from `bodies`, or None for `media_type` text.
    ok: type | None
    errors: tuple[type[SidecarError], ...] = ()
    parameters: tuple[Parameter, ...] = ()
    request: type | None = None
    # Also takes and gives the binary tensor data extension's octet-stream bodies.
    binary: bool = False
    # A probe answers 503 with its usual body rather than an error.
    probe: bool = False
    media_type: str = "application/json"


PATH_PARAMETERS = {
    "name": Parameter("name", "path", {"type": "string"}, "The model's name (--model-name)."),
    "version": Parameter(
        "version",
        "path",
        {"type": "string"},
        f"The model version; the sidecar serves {MODEL_VERSION!r}.",
    ),
}
TIMEOUT = Parameter(
    TIMEOUT_HEADER,
    "header",
    {"type": "number", "exclusiveMinimum": 0, "x-unit": "milliseconds"},
    "A deadline in milliseconds; it only ever shortens the configured timeoutMs.",
)
JSON_HEADER_LENGTH = Parameter(
    HEADER_LENGTH,
    "header",
    {"type": "integer", "minimum": 1},
    "Binary tensor data extension: the length of the JSON header; raw tensor data follows.",
)
# Every error an inference request can meet, whatever its body.
INFER_ERRORS = (
    BadRequest,
    ModelNotFound,
    BodyTimeout,
    PayloadTooLarge,
    QueueFull,
    Late,
    SidecarError,
    BadModelResponse,
    Unavailable,
    DeadlineExceeded,
)

LIVE = Operation("Live while the sidecar can serve; 503: restart it.", bodies.Live, probe=True)
READY = Operation(
    "Ready while the model server is and the sidecar is not shutting down.",
    bodies.Ready,
    probe=True,
)
V1_LIVE = Operation("KServe v1 liveness: alive while the process answers.", bodies.V1Live)
SERVER_METADATA = Operation("Server metadata.", bodies.ServerMetadata)
MODEL_METADATA = Operation("Model metadata.", bodies.ModelMetadata, (ModelNotFound, Unavailable))
BATCHING = Operation(
    "The batching settings in use; after a change to the settings file, they show when it "
    "has been taken.",
    bodies.Batching,
    (ModelNotFound,),
)
MODEL_READY = Operation("Model readiness.", bodies.ModelReady, (ModelNotFound,), probe=True)
INFER = Operation(
    "Inference: one result per item, in order.",
    bodies.InferenceResponse,
    INFER_ERRORS,
    (TIMEOUT, JSON_HEADER_LENGTH),
    bodies.InferenceRequest,
    binary=True,
)
PREDICT = Operation(
    "KServe v1 prediction, for models with one input: one prediction per instance.",
    bodies.PredictResponse,
    INFER_ERRORS,
    (TIMEOUT,),
    bodies.PredictRequest,
)
GENERATE = Operation(
    "Open Inference Protocol generate extension: text for one prompt, for models that take "
    "text_input and give text_output.",
    bodies.GenerationResponse,
    INFER_ERRORS,
    (TIMEOUT,),
    bodies.GenerationRequest,
)
GENERATE_STREAM = Operation(
    "Open Inference Protocol generate extension, streamed: Server-Sent Events, one per "
    "piece of text as the model makes it (in one piece from a model that does not stream "
    "tokens); errors found before the first piece are answered as for generate.",
    bodies.GenerationStreamEvent,
    INFER_ERRORS,
    (TIMEOUT,),
    bodies.GenerationRequest,
    media_type="text/event-stream",
)
METRICS = Operation("Prometheus metrics.", None, media_type="text/plain")
OPENAPI = Operation("This document (OpenAPI 3.1).", None)
