"""Open Inference Protocol generate extension bodies (`POST /v2/models/{name}/generate`).

`{"text_input": "...", "parameters": {"max_new_tokens": 16, "temperature": 0, "stop": ["\\n"]}}`
is answered with `{"model_name": ..., "model_version": ..., "text_output": "..."}`.
`parameters` also takes `priority` and `timeout` as /infer does; unknown keys are ignored.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import orjson

from carpool.contract.generation import MAX_NEW_TOKENS, STOP, TEMPERATURE, TEXT_INPUT, TEXT_OUTPUT
from carpool.contract.metadata import ModelMetadata
from carpool.contract.wire import BYTES
from carpool.engine.errors import BadRequest
from carpool_sidecar import counting, generation
from carpool_sidecar.generation import GenerateRequest, GenerateResponse
from carpool_sidecar.inference import MODEL_VERSION
from carpool_sidecar.oip import decode, integer_parameter, scalar_parameters, timeout_parameter

NOT_STOP_STRINGS = f"parameter {STOP!r} must be a string or a list of strings"


class _Parameters(msgspec.Struct):
    max_new_tokens: msgspec.Raw = msgspec.Raw()
    temperature: msgspec.Raw = msgspec.Raw()
    priority: msgspec.Raw = msgspec.Raw()
    timeout: msgspec.Raw = msgspec.Raw()
    # Kept as text: its strings are counted before they are decoded.
    stop: msgspec.Raw = msgspec.Raw()


class _Document(msgspec.Struct):
    """A generate request as msgspec reads it: unknown keys and parameters become no
    objects."""

    text_input: str | None = None
    parameters: _Parameters | None = None


def parse_request(body: bytes | bytearray, metadata: ModelMetadata) -> GenerateRequest:
    """The request in `body` for a model that generates text; its stop strings are counted
    against what `metadata` allows before they are decoded."""
    generation.check_generates(metadata)
    document = decode(body, _Document)
    if document.text_input is None:
        raise BadRequest(f"{TEXT_INPUT!r} must be a string")
    raw = document.parameters or _Parameters()
    parameters = scalar_parameters(raw, STOP)
    return GenerateRequest(
        text_input=document.text_input,
        max_new_tokens=_max_new_tokens(parameters.get(MAX_NEW_TOKENS)),
        temperature=_temperature(parameters.get(TEMPERATURE)),
        stop=_stop(raw.stop, metadata),
        priority=integer_parameter(parameters, "priority", 0),
        timeout_ms=timeout_parameter(parameters),
    )


def encode_response(response: GenerateResponse) -> bytes:
    return orjson.dumps(
        {
            "model_name": response.model_name,
            "model_version": MODEL_VERSION,
            TEXT_OUTPUT: response.text_output,
        }
    )


def _max_new_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"parameter {MAX_NEW_TOKENS!r} must be an integer >= 1, got {value!r}")
    return value


def _temperature(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"parameter {TEMPERATURE!r} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise BadRequest(f"parameter {TEMPERATURE!r} must be finite and >= 0, got {value!r}")
    return float(value)


def _stop(raw: msgspec.Raw, metadata: ModelMetadata) -> tuple[str, ...] | None:
    """Stop strings: a list of strings, or one string; as many as the model takes."""
    if not raw:
        return None
    text = bytes(raw)
    if text.startswith(b"["):
        # Strings past the model's limit are counted, not looked at one by one.
        spec = metadata.input(STOP)
        most = 0 if spec is None else spec.max_elements or len(text)
        try:
            count, _ = counting.elements(STOP, BYTES, text, most, strings=True)
        except BadRequest:
            raise BadRequest(NOT_STOP_STRINGS) from None
        generation.check_values(metadata, STOP, count)
    try:
        value = msgspec.json.decode(text, type=str | list[str])
    except msgspec.ValidationError:
        raise BadRequest(NOT_STOP_STRINGS) from None
    return (value,) if isinstance(value, str) else tuple(value)
