"""Text generation as the data plane sees it: one prompt and its settings, as model inputs.

Protocol-neutral, as `inference.py` is for inference: the generate route's codec
(`oip_generate`) yields a GenerateRequest, and the data plane turns it into the items of a
model that takes `text_input` (the built-in `text-generation` handler, or any handler with
these input names). Every setting the model declares is sent on every item, its default
filled in, so that requests with and without a setting share one shape signature.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from carpool.contract.generation import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    FINISH_REASON,
    FINISH_REASONS,
    GENERATED_TOKENS,
    MAX_NEW_TOKENS,
    NO_SEED,
    PROMPT_TOKENS,
    SEED,
    STOP,
    TEMPERATURE,
    TEXT_INPUT,
    TEXT_OUTPUT,
    setting_name,
)
from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.contract.wire import BYTES, Tensor
from carpool.engine.errors import BadModelResponse, BadRequest
from carpool_sidecar.answers import Held
from carpool_sidecar.tensors import RequestTensor, from_json, json_values


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    text_input: str
    id: str | None = None  # the caller's, returned in the answer
    # None: not given; the model's default is sent where the model takes the setting.
    max_tokens: int | None = None
    temperature: float | None = None  # 0: greedy
    stop: tuple[str, ...] | None = None
    seed: int | None = None  # of a sampled answer's draws
    priority: int = 0
    # The caller's own deadline; only ever shortens the configured timeout.
    timeout_ms: float | None = None
    # What the request used that is deprecated, for the caller to read in the answer.
    deprecations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Ending:
    """How an answer ended, where the model says: each field None when it does not."""

    finish_reason: str | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class GenerateResponse:
    model_name: str
    text_output: str
    ending: Ending = Ending()
    # Its room in the answer budget, released by the front once the answer is sent.
    held: Held | None = None


def model_inputs(request: GenerateRequest, metadata: ModelMetadata) -> list[RequestTensor]:
    """The request as one item of the model's inputs; BadRequest when the model does not
    generate text or does not take a setting the request gives."""
    check_generates(metadata)
    given: list[tuple[str, object, object]] = [
        (MAX_NEW_TOKENS, request.max_tokens, DEFAULT_MAX_TOKENS),
        (TEMPERATURE, request.temperature, DEFAULT_TEMPERATURE),
        # An empty stop string stops nothing; one element keeps the item's shape [1].
        (STOP, request.stop or None, ("",)),
        (SEED, request.seed, NO_SEED),
    ]
    inputs = [_tensor(TEXT_INPUT, BYTES, [request.text_input])]
    for name, value, default in given:
        if value is not None:
            check_values(metadata, name, len(_as_sequence(value)))
        spec = metadata.input(name)
        if spec is None:
            continue
        if value is None:
            inputs.append(_tensor(name, spec.datatype, list(_as_sequence(default))))
        else:
            inputs.append(_setting(spec, list(_as_sequence(value))))
    return inputs


def _setting(spec: TensorSpec, values: list[object]) -> RequestTensor:
    """A setting the request gives as the model's input; BadRequest, naming the parameter
    as the caller named it, when a value is past what the input holds or the model runs."""
    try:
        tensor = _tensor(spec.name, spec.datatype, values)
        error = spec.limit_error(tensor.shape[1:], tensor.data)
    except BadRequest as refused:
        error = refused.message
    if error is None:
        return tensor
    parameter = setting_name(spec.name)
    raise BadRequest(error.replace(f"input {spec.name!r}", f"parameter {parameter!r}", 1))


def check_values(metadata: ModelMetadata, name: str, count: int) -> None:
    """BadRequest when a request gives `count` values of the setting `name` and the model
    takes none, or fewer."""
    spec = metadata.input(name)
    if spec is None:
        raise BadRequest(f"parameter {name!r}: model {metadata.name!r} takes no {name}")
    if (error := spec.limit_error((count,), [])) is not None:
        raise BadRequest(error)


def check_generates(metadata: ModelMetadata) -> None:
    """BadRequest unless the model takes a `text_input` and gives a `text_output`, as text."""
    for kind, name, spec in (
        ("input", TEXT_INPUT, metadata.input(TEXT_INPUT)),
        ("output", TEXT_OUTPUT, metadata.output(TEXT_OUTPUT)),
    ):
        if spec is None or spec.datatype != BYTES:
            raise BadRequest(
                f"model {metadata.name!r} has no BYTES {kind} {name!r}: it does not generate "
                "text; use /infer"
            )


def settings_bucket(inputs: Sequence[RequestTensor]) -> int | None:
    """The power of two at or above the largest `max_new_tokens` of the request's items, or
    None when the request has no such input (the model takes none, or it is left out for the
    model's default: such requests share a signature of their own, `batch_keys.batch_key`):
    a batch generates until its longest row is done, so a short request should not share a
    batch with a much longer one."""
    tensor = next((each for each in inputs if each.name == MAX_NEW_TOKENS), None)
    if tensor is None or isinstance(tensor.data, list) or not tensor.data.size:
        return None
    values = json_values(tensor)  # BF16 and FP16 as float32
    assert not isinstance(values, list)
    largest = float(values.max())
    if not math.isfinite(largest) or largest < 1:
        return None  # the model refuses such an item; any group will do
    return 1 << (math.ceil(largest) - 1).bit_length()


def ending_of(outputs: Mapping[str, Tensor]) -> Ending:
    """The finish reason and token counts among one item's outputs, those it has."""
    reason = outputs.get(FINISH_REASON)
    if reason is not None:
        reason_text = text_of(reason, FINISH_REASON)
        if reason_text not in FINISH_REASONS:
            raise BadModelResponse(
                f"{FINISH_REASON!r} must be one of {list(FINISH_REASONS)}, got {reason_text!r}"
            )
    return Ending(
        None if reason is None else reason_text,
        _count_of(outputs.get(PROMPT_TOKENS), PROMPT_TOKENS),
        _count_of(outputs.get(GENERATED_TOKENS), GENERATED_TOKENS),
    )


def ending_tensors(ending: Ending) -> list[RequestTensor]:
    """How an answer of one item ended, as the outputs of that name it has, each [1, 1]."""
    tensors = []
    if ending.finish_reason is not None:
        reason = [ending.finish_reason.encode()]
        tensors.append(RequestTensor(FINISH_REASON, BYTES, (1, 1), reason))
    for name, count in (
        (PROMPT_TOKENS, ending.prompt_tokens),
        (GENERATED_TOKENS, ending.generated_tokens),
    ):
        if count is not None:
            tensors.append(RequestTensor(name, "INT32", (1, 1), np.array([count], np.int32)))
    return tensors


def _count_of(output: Tensor | None, name: str) -> int | None:
    if output is None:
        return None
    if not output.datatype.startswith(("INT", "UINT")) or output.element_count != 1:
        raise BadModelResponse(f"{name!r} must be one integer, got {output.datatype}")
    value = int(output.to_numpy().reshape(-1)[0])
    if value < 0:
        raise BadModelResponse(f"{name!r} must be >= 0, got {value}")
    return value


def text_of(output: Tensor, name: str = TEXT_OUTPUT) -> str:
    """The generated text of one item's `text_output`."""
    if output.datatype != BYTES or not isinstance(output.data, list) or len(output.data) != 1:
        raise BadModelResponse(
            f"{name!r} must be one BYTES element, got {output.datatype}{list(output.shape)}"
        )
    try:
        return output.data[0].decode()
    except UnicodeDecodeError as error:
        raise BadModelResponse(f"{name!r} is not UTF-8 text: {error}") from None


def _tensor(name: str, datatype: str, values: list[object]) -> RequestTensor:
    shape = (1, len(values))
    return RequestTensor(name, datatype, shape, from_json(name, datatype, shape, values))


def _as_sequence(value: object) -> Sequence[object]:
    return value if isinstance(value, tuple | list) else (value,)
