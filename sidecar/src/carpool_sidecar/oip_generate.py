"""Open Inference Protocol generate extension bodies (`POST /v2/models/{name}/generate`).

`{"text_input": "...", "parameters": {"max_new_tokens": 16, "temperature": 0, "stop": ["\\n"]}}`
is answered with `{"model_name": ..., "model_version": ..., "text_output": "..."}`.
`parameters` also takes `priority` and `timeout` as /infer does; unknown keys are ignored.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from carpool.contract.generation import MAX_NEW_TOKENS, STOP, TEMPERATURE, TEXT_INPUT, TEXT_OUTPUT
from carpool.engine.errors import BadRequest
from carpool_sidecar.generation import GenerateRequest, GenerateResponse
from carpool_sidecar.inference import MODEL_VERSION
from carpool_sidecar.oip import integer_parameter, loads, parameters_of, timeout_parameter


def parse_request(body: bytes | bytearray) -> GenerateRequest:
    document = loads(body)
    if not isinstance(document, dict):
        raise BadRequest("request must be a JSON object")
    text = document.get(TEXT_INPUT)
    if not isinstance(text, str):
        raise BadRequest(f"{TEXT_INPUT!r} must be a string, got {text!r}")
    parameters = parameters_of(document, "request")
    return GenerateRequest(
        text_input=text,
        max_new_tokens=_max_new_tokens(parameters.get(MAX_NEW_TOKENS)),
        temperature=_temperature(parameters.get(TEMPERATURE)),
        stop=_stop(parameters.get(STOP)),
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


def _stop(value: Any) -> tuple[str, ...] | None:
    """Stop strings: a list of strings, or one string."""
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(each, str) for each in value):
        raise BadRequest(f"parameter {STOP!r} must be a string or a list of strings")
    return tuple(value)
