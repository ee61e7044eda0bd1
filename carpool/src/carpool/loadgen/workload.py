"""Request bodies for the load generator, serialised before the clock starts.

A workload is a short list of ready-to-send requests that the loops cycle through, so the
load generator spends its time on the network and not on building JSON.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest

Protocol = Literal["oip-json", "oip-binary", "kserve-v1", "grpc"]
PROTOCOLS: tuple[Protocol, ...] = ("oip-json", "oip-binary", "kserve-v1", "grpc")
TextLength = Literal["short", "mixed", "long"]
TEXT_LENGTHS: tuple[TextLength, ...] = ("short", "mixed", "long")

# The gRPC method a "grpc" request calls (its `path`).
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# Distinct bodies per workload: enough variety for the text mix, few enough to build quickly.
DEFAULT_VARIANTS = 64

# Sentences of everyday lengths, the kind of text an embedding service receives.
SENTENCES: tuple[str, ...] = (
    "The train was late again this morning.",
    "Please send me the invoice by Friday.",
    "How do I reset my password?",
    "The museum opens at nine and closes at five on weekdays.",
    "She planted tomatoes, basil and a row of sunflowers along the fence.",
    "Our quarterly revenue grew by four percent compared with last year.",
    "Can you recommend a quiet restaurant near the station?",
    "The bridge will be closed for repairs until the end of the month.",
    "He forgot his umbrella and got soaked on the way home.",
    "Machine learning models need careful evaluation before deployment.",
    "The library has extended its opening hours during the exam period.",
    "Add two eggs, a cup of flour and a pinch of salt, then whisk until smooth.",
    "The delivery arrived damaged, so I would like a replacement.",
    "Cats often sleep for more than twelve hours a day.",
    "The committee postponed its decision until more data is available.",
    "Wind turbines on the ridge supply power to three nearby villages.",
    "My flight was cancelled and the airline offered a voucher instead of a refund.",
    "The concert was sold out within minutes of the tickets going on sale.",
    "Regular backups protect small businesses from losing their records.",
    "The river flooded the lower fields after a week of heavy rain.",
    "Where can I find the terms and conditions for this subscription?",
    "The new update drains my phone battery much faster than before.",
    "Children learn languages more easily when they hear them every day.",
    "The hotel room was clean, but the air conditioning was far too loud.",
    "A good night's sleep improves memory and concentration.",
    "The city council approved a plan for more cycle lanes downtown.",
    "I would like to change the shipping address on my order.",
    "The volcano has been quiet for nearly two hundred years.",
    "Our team meets every Monday to review the previous week's incidents.",
    "Fresh bread from the bakery on the corner sells out before noon.",
    "The contract can be cancelled with thirty days' written notice.",
    "Astronomers detected water vapour in the atmosphere of a distant planet.",
    "The printer on the third floor keeps jamming when printing on both sides.",
    "Most of the forest burned, yet new shoots appeared within a few weeks.",
    "Is there a discount for students or people over sixty-five?",
    "The recipe calls for ripe bananas, brown sugar and a little cinnamon.",
    "Traffic on the motorway was slow because of roadworks near the junction.",
    "The software team moved the service to a new cluster over the weekend.",
    "Thank you for your patience while we look into the problem.",
    "The painting was sold at auction for three times its estimated price.",
)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request ready to send: path under the base URL, body and headers."""

    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    # Samples in this request, for items-per-second figures.
    items: int = 1


def text_items(count: int, length: TextLength, rng: random.Random) -> list[str]:
    """`count` texts: one sentence (short), one to four (mixed), or about 150 words (long)."""
    texts = []
    for _ in range(count):
        if length == "short":
            parts = 1
        elif length == "mixed":
            parts = rng.randint(1, 4)
        else:
            parts = rng.randint(12, 16)
        texts.append(" ".join(rng.choice(SENTENCES) for _ in range(parts)))
    return texts


def toy_items(count: int, shape: Sequence[int], rng: random.Random) -> npt.NDArray[np.float32]:
    """`count` FP32 samples of `shape`, stacked on a leading batch dimension."""
    generator = np.random.default_rng(rng.getrandbits(32))
    return generator.standard_normal((count, *shape), dtype=np.float32)


def _oip_tensor_header(name: str, datatype: str, shape: Sequence[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(shape)}


def _binary_bytes(texts: Sequence[str]) -> bytes:
    # The binary tensor extension sends BYTES as a 4-byte little-endian length per element.
    chunks = []
    for text in texts:
        raw = text.encode()
        chunks.append(struct.pack("<I", len(raw)))
        chunks.append(raw)
    return b"".join(chunks)


def encode(
    protocol: Protocol,
    model_name: str,
    input_name: str,
    batch: list[str] | npt.NDArray[np.float32],
) -> PreparedRequest:
    """Serialise one request holding `batch` (texts, or FP32 samples on axis 0)."""
    items = len(batch)
    if protocol == "grpc":
        return _grpc_request(model_name, input_name, batch)
    if protocol == "kserve-v1":
        instances = batch if isinstance(batch, list) else batch.tolist()
        body = orjson.dumps({"instances": instances})
        return PreparedRequest(
            f"/v1/models/{model_name}:predict",
            body,
            {"Content-Type": "application/json"},
            items,
        )
    path = f"/v2/models/{model_name}/infer"
    if isinstance(batch, list):
        # One string per item: the per-item shape is [1], as text handlers declare it.
        tensor = _oip_tensor_header(input_name, "BYTES", [items, 1])
        raw = _binary_bytes(batch)
        flat: list[Any] = list(batch)
    else:
        tensor = _oip_tensor_header(input_name, "FP32", batch.shape)
        raw = np.ascontiguousarray(batch, dtype="<f4").tobytes()
        flat = batch.reshape(-1).tolist()
    if protocol == "oip-json":
        tensor["data"] = flat
        body = orjson.dumps({"inputs": [tensor]})
        return PreparedRequest(path, body, {"Content-Type": "application/json"}, items)
    tensor["parameters"] = {"binary_data_size": len(raw)}
    header = orjson.dumps({"inputs": [tensor]})
    return PreparedRequest(
        path,
        header + raw,
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
        items,
    )


def _grpc_request(
    model_name: str, input_name: str, batch: list[str] | npt.NDArray[np.float32]
) -> PreparedRequest:
    """A ModelInferRequest with its data in raw_input_contents, as tritonclient sends it."""
    request = ModelInferRequest(model_name=model_name)
    if isinstance(batch, list):
        request.inputs.add(name=input_name, datatype="BYTES", shape=[len(batch), 1])
        request.raw_input_contents.append(_binary_bytes(batch))
    else:
        request.inputs.add(name=input_name, datatype="FP32", shape=batch.shape)
        request.raw_input_contents.append(np.ascontiguousarray(batch, dtype="<f4").tobytes())
    return PreparedRequest(MODEL_INFER, request.SerializeToString(), items=len(batch))


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to send: the payload kind, its size per request and the wire protocol."""

    protocol: Protocol = "oip-json"
    payload: Literal["text", "toy"] = "toy"
    model_name: str = "toy"
    input_name: str = "input"
    input_shape: tuple[int, ...] = (4,)
    text_length: TextLength = "mixed"
    batch_per_request: int = 1
    variants: int = DEFAULT_VARIANTS
    seed: int = 0


def build(spec: WorkloadSpec) -> list[PreparedRequest]:
    """The requests a run cycles through, all serialised now."""
    if spec.batch_per_request < 1:
        raise ValueError(f"batch_per_request must be at least 1, got {spec.batch_per_request}")
    rng = random.Random(spec.seed)
    prepared = []
    for _ in range(max(1, spec.variants)):
        batch: list[str] | npt.NDArray[np.float32]
        if spec.payload == "text":
            batch = text_items(spec.batch_per_request, spec.text_length, rng)
        else:
            batch = toy_items(spec.batch_per_request, spec.input_shape, rng)
        prepared.append(encode(spec.protocol, spec.model_name, spec.input_name, batch))
    return prepared
