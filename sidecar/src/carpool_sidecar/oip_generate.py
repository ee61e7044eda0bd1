"""Open Inference Protocol generate extension bodies (`POST /v2/models/{name}/generate`).

`{"text_input": "...", "parameters": {"max_tokens": 16, "temperature": 0, "stop": ["\\n"]}}`
is answered with `{"model_name": ..., "model_version": ..., "text_output": "...",
"finish_reason": "length", "prompt_tokens": 5, "generated_tokens": 16}` (the last three where
the model tells them). `parameters` also takes `priority` and `timeout` as /infer does;
unknown keys are ignored. The settings that are the model's inputs may also come beside
`text_input` (`{"text_input": "...", "max_tokens": 16}`), as the extension passes a
request's other keys to the inputs of their names. `max_new_tokens`, carpool's name before
it followed the extension, is still taken, with a deprecation warning in the answer's
`Warning` header.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import msgspec
import orjson

from carpool.contract.generation import (
    FINISH_REASON,
    GENERATED_TOKENS,
    MAX_NEW_TOKENS,
    MAX_TOKENS,
    PROMPT_TOKENS,
    SEED,
    SETTINGS,
    STOP,
    TEMPERATURE,
    TEXT_INPUT,
    TEXT_OUTPUT,
)
from carpool.contract.metadata import ModelMetadata
from carpool.contract.wire import BYTES
from carpool.engine.errors import BadRequest
from carpool_sidecar import counting, generation
from carpool_sidecar.generation import GenerateRequest, GenerateResponse
from carpool_sidecar.inference import MODEL_VERSION
from carpool_sidecar.oip import decode, integer_parameter, scalar_parameters, timeout_parameter
from carpool_sidecar.streaming import Piece

log = logging.getLogger(__name__)
NOT_STOP_STRINGS = f"parameter {STOP!r} must be a string or a list of strings"
DEPRECATED_MAX_NEW_TOKENS = f"parameter {MAX_NEW_TOKENS!r} is deprecated: use {MAX_TOKENS!r}"


class _Parameters(msgspec.Struct):
    max_tokens: msgspec.Raw = msgspec.Raw()
    max_new_tokens: msgspec.Raw = msgspec.Raw()  # deprecated
    temperature: msgspec.Raw = msgspec.Raw()
    seed: msgspec.Raw = msgspec.Raw()
    priority: msgspec.Raw = msgspec.Raw()
    timeout: msgspec.Raw = msgspec.Raw()
    # Kept as text: its strings are counted before they are decoded.
    stop: msgspec.Raw = msgspec.Raw()


class _Document(msgspec.Struct):
    """A generate request as msgspec reads it: unknown keys and parameters become no
    objects. The extension passes a request's other keys to the model's inputs of their
    names, so the settings that are inputs may also come beside `text_input`."""

    id: str | None = None
    text_input: str | None = None
    parameters: _Parameters | None = None
    max_tokens: msgspec.Raw = msgspec.Raw()
    max_new_tokens: msgspec.Raw = msgspec.Raw()
    temperature: msgspec.Raw = msgspec.Raw()
    seed: msgspec.Raw = msgspec.Raw()
    stop: msgspec.Raw = msgspec.Raw()


def parse_request(body: bytes | bytearray, metadata: ModelMetadata) -> GenerateRequest:
    """The request in `body` for a model that generates text; its stop strings are counted
    against what `metadata` allows before they are decoded."""
    generation.check_generates(metadata)
    document = decode(body, _Document)
    if document.text_input is None:
        raise BadRequest(f"{TEXT_INPUT!r} must be a string")
    raw = _settings(document)
    parameters = scalar_parameters(raw, STOP)
    max_tokens, deprecations = _max_tokens(parameters)
    return GenerateRequest(
        text_input=document.text_input,
        id=document.id,
        max_tokens=max_tokens,
        temperature=_temperature(parameters.get(TEMPERATURE)),
        stop=_stop(raw.stop, metadata),
        seed=_seed(parameters.get(SEED)),
        priority=integer_parameter(parameters, "priority", 0),
        timeout_ms=timeout_parameter(parameters),
        deprecations=deprecations,
    )


def encode_event(model_name: str, request_id: str | None, piece: Piece) -> bytes:
    """One Server-Sent Event of `generate_stream`: a piece of text, or the last one."""
    document = answer_document(model_name, request_id, piece.text, piece.final)
    document["done"] = piece.final is not None
    return b"data: " + orjson.dumps(document) + b"\n\n"


def encode_error_event(message: str) -> bytes:
    """The last event of a stream that broke off after its first piece."""
    return b"data: " + orjson.dumps({"error": message}) + b"\n\n"


def answer_headers(request: GenerateRequest) -> dict[str, str]:
    """The answer's headers beside its content type: a `Warning` (RFC 7234's 299,
    "miscellaneous persistent warning") for each deprecated parameter the request used."""
    if not request.deprecations:
        return {}
    return {"Warning": ", ".join(f'299 carpool "{note}"' for note in request.deprecations)}


def encode_response(response: GenerateResponse, request_id: str | None) -> bytes:
    return orjson.dumps(
        answer_document(response.model_name, request_id, response.text_output, response)
    )


def answer_document(
    model_name: str, request_id: str | None, text_output: str, response: GenerateResponse | None
) -> dict[str, Any]:
    """An answer as the extension writes it, with the request's id where it gave one; with
    `response`, how that answer ended."""
    document: dict[str, Any] = {} if request_id is None else {"id": request_id}
    document.update(
        {"model_name": model_name, "model_version": MODEL_VERSION, TEXT_OUTPUT: text_output}
    )
    if response is not None:
        ending = response.ending
        given = (
            (FINISH_REASON, ending.finish_reason),
            (PROMPT_TOKENS, ending.prompt_tokens),
            (GENERATED_TOKENS, ending.generated_tokens),
        )
        document.update((key, value) for key, value in given if value is not None)
    return document


def _settings(document: _Document) -> _Parameters:
    """The parameters, with the settings given beside `text_input` among them."""
    raw = document.parameters or _Parameters()
    for name in SETTINGS:
        given = getattr(document, name)
        if not _given(given):
            continue
        if _given(getattr(raw, name)):
            raise BadRequest(f"give {name!r} once: beside 'text_input' or among the parameters")
        raw = msgspec.structs.replace(raw, **{name: given})
    return raw


def _given(raw: msgspec.Raw) -> bool:
    """Whether a setting is given: null is as if left out."""
    return bool(raw) and bytes(raw) != b"null"


def _max_tokens(parameters: dict[str, Any]) -> tuple[int | None, tuple[str, ...]]:
    """`max_tokens`, or the deprecated `max_new_tokens` with its deprecation note."""
    if parameters.get(MAX_NEW_TOKENS) is None:  # null: not given
        return _token_count(MAX_TOKENS, parameters.get(MAX_TOKENS)), ()
    if MAX_TOKENS in parameters:
        raise BadRequest(f"give {MAX_TOKENS!r} only: {MAX_NEW_TOKENS!r} is its deprecated name")
    log.info("a generate request used %s", DEPRECATED_MAX_NEW_TOKENS)
    count = _token_count(MAX_NEW_TOKENS, parameters[MAX_NEW_TOKENS])
    return count, (DEPRECATED_MAX_NEW_TOKENS,)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"parameter {SEED!r} must be an integer >= 0, got {value!r}")
    return value


def _token_count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"parameter {name!r} must be an integer >= 1, got {value!r}")
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
    text = bytes(raw)
    if not text or text == b"null":  # null: not given, as for the other parameters
        return None
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
    except UnicodeDecodeError:  # the raw value's strings are read only here
        raise BadRequest(f"parameter {STOP!r} is not UTF-8 text") from None
    return (value,) if isinstance(value, str) else tuple(value)
