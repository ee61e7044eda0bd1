"""The JSON bodies of the sidecar's HTTP API, as types.

The routes build their small answers with these, and `openapi` turns them into the
document's schemas (pydantic writes the JSON Schema), so the two cannot disagree. The
inference bodies are parsed and written by the codecs (`oip`, `kserve_v1`) for speed; the
contract test (`tests/sidecar/test_openapi.py`) keeps them to these types.
"""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from pydantic import Field, WithJsonSchema

# pydantic needs typing_extensions' TypedDict before Python 3.12.
from typing_extensions import TypedDict

from carpool.contract.generation import FINISH_REASONS
from carpool.contract.wire import DATATYPES

Datatype = Annotated[str, WithJsonSchema({"enum": sorted(DATATYPES)})]
Count = Annotated[int, Field(ge=0)]


class Error(TypedDict):
    error: str


class Live(TypedDict):
    live: bool


class V1Live(TypedDict):
    status: str


class Ready(TypedDict):
    ready: bool


class ServerMetadata(TypedDict):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(TypedDict):
    name: str
    datatype: Datatype
    shape: Annotated[list[Annotated[int, Field(ge=-1)]], Field(description="-1: any length.")]


class ModelMetadata(TypedDict):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelReady(TypedDict):
    name: str
    ready: bool


class Batching(TypedDict):
    batching: Annotated[
        dict[str, float | str],
        Field(
            description="The batching settings in use, by settings-file key: flags and "
            "environment with the settings file (--config-file) laid over them, as last read."
        ),
    ]


Priority = Annotated[
    int, Field(ge=0, description="Level 1 is served first, then 2, ...; 0 (default) last.")
]
TimeoutUs = Annotated[
    float,
    Field(
        gt=0,
        description="Deadline in microseconds, as Triton clients send it; it only ever "
        "shortens the configured timeoutMs.",
        json_schema_extra={"x-unit": "microseconds"},
    ),
]


class InferParameters(TypedDict):
    """Request parameters; unknown keys are ignored."""

    priority: NotRequired[Priority]
    timeout: NotRequired[TimeoutUs]
    binary_data_output: NotRequired[bool]


class BinaryDataSize(TypedDict):
    binary_data_size: NotRequired[Count]


class RequestInput(TypedDict):
    name: str
    datatype: Datatype
    shape: Annotated[list[Count], Field(min_length=1)]
    parameters: NotRequired[BinaryDataSize]
    data: NotRequired[
        Annotated[
            Any,
            Field(description="Flat or nested values; absent when the data is binary."),
        ]
    ]


class BinaryData(TypedDict):
    binary_data: NotRequired[bool]


class RequestedOutput(TypedDict):
    name: str
    parameters: NotRequired[BinaryData]


class InferenceRequest(TypedDict):
    id: NotRequired[str]
    parameters: NotRequired[InferParameters]
    inputs: Annotated[list[RequestInput], Field(min_length=1)]
    outputs: NotRequired[list[RequestedOutput]]


class ResponseOutput(TypedDict):
    name: str
    datatype: Datatype
    shape: list[Count]
    data: NotRequired[list[Any]]
    parameters: NotRequired[BinaryDataSize]


class InferenceResponse(TypedDict):
    id: NotRequired[str]
    model_name: str
    model_version: str
    outputs: list[ResponseOutput]


class PredictRequest(TypedDict):
    instances: Annotated[list[Any], Field(min_length=1)]


class PredictResponse(TypedDict):
    predictions: list[Any]


class GenerationSettings(TypedDict):
    """Generation settings, sent to the model's inputs of the same names."""

    max_tokens: NotRequired[
        Annotated[int, Field(ge=1, description="Tokens to generate at most (default 20).")]
    ]
    max_new_tokens: NotRequired[
        Annotated[
            int,
            Field(ge=1, description="Deprecated name of max_tokens.", deprecated=True),
        ]
    ]
    temperature: NotRequired[
        Annotated[float, Field(ge=0, description="0 (default): greedy; above 0: sampling.")]
    ]
    stop: NotRequired[
        Annotated[
            str | list[str],
            Field(description="Stop strings: the output ends before the first one."),
        ]
    ]
    seed: NotRequired[
        Annotated[
            int,
            Field(ge=0, description="Seed of a sampled answer's draws: the same text each time."),
        ]
    ]


class GenerationParameters(GenerationSettings):
    """The generation settings, and the request's priority and deadline; unknown keys are
    ignored."""

    priority: NotRequired[Priority]
    timeout: NotRequired[TimeoutUs]


class GenerationRequest(GenerationSettings):
    """The prompt and its parameters; a setting may also come beside the prompt, as the
    extension passes a request's other keys to the model's inputs (not in both places)."""

    id: NotRequired[Annotated[str, Field(description="Returned in the answer.")]]
    text_input: Annotated[str, Field(description="The prompt.")]
    parameters: NotRequired[GenerationParameters]


class GenerationResponse(TypedDict):
    id: NotRequired[Annotated[str, Field(description="The request's, where it gave one.")]]
    model_name: str
    model_version: str
    text_output: Annotated[str, Field(description="The generated text, without the prompt.")]
    finish_reason: NotRequired[
        Annotated[
            str,
            Field(
                description="Why the text ended: its token limit, end of sequence, a stop string.",
                json_schema_extra={"enum": list(FINISH_REASONS)},
            ),
        ]
    ]
    prompt_tokens: NotRequired[Annotated[int, Field(ge=0, description="Tokens of the prompt.")]]
    generated_tokens: NotRequired[
        Annotated[int, Field(ge=0, description="Tokens generated for the text.")]
    ]


class GenerationStreamEvent(TypedDict):
    """One Server-Sent Event of `generate_stream` (its `data:`): the text's next piece; the
    last event has `done` true and says how the answer ended."""

    text_output: Annotated[str, Field(description="The next piece of the generated text.")]
    model_name: str
    model_version: str
    done: Annotated[bool, Field(description="True on the last event only.")]
    finish_reason: NotRequired[
        Annotated[str, Field(json_schema_extra={"enum": list(FINISH_REASONS)})]
    ]
    prompt_tokens: NotRequired[Annotated[int, Field(ge=0)]]
    generated_tokens: NotRequired[Annotated[int, Field(ge=0)]]
    error: NotRequired[
        Annotated[str, Field(description="Why the answer broke off; the last event then.")]
    ]
