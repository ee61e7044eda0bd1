"""The model metadata document, written by the model server and read by the sidecar."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from carpool.contract.handlers import BUILTIN_HANDLERS
from carpool.contract.metadata import Metadata, MetadataError, ModelMetadata, TensorSpec
from carpool_model_server.handler import Handler, load_handler_class

DECLARED = Metadata(
    platform="test",
    inputs=(TensorSpec("text", "BYTES", (1,)),),
    outputs=(TensorSpec("embedding", "FP32", (-1, 384)),),
    pads_variable_dims=True,
)


def test_a_served_document_reads_back_as_it_was_written() -> None:
    served = ModelMetadata.served(DECLARED, "minilm", 64)
    document = orjson.loads(orjson.dumps(served.encode()))  # as it crosses the socket
    assert ModelMetadata.decode(document) == served
    assert document["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [1]}]
    assert served.output("embedding") == DECLARED.outputs[0]
    assert served.input("embedding") is None


def test_per_item_limits_travel_with_their_input() -> None:
    limited = Metadata(
        platform="test",
        inputs=(TensorSpec("text", "BYTES", (-1,), max_elements=4, max_element_bytes=100),),
        outputs=DECLARED.outputs,
    )
    served = ModelMetadata.served(limited, "m", 8)
    document = orjson.loads(orjson.dumps(served.encode()))
    assert document["inputs"][0]["max_elements"] == 4
    assert document["inputs"][0]["max_element_bytes"] == 100
    spec = ModelMetadata.decode(document).inputs[0]
    assert spec == limited.inputs[0]
    assert spec.limit_error((4,), [b"x" * 100] * 4) is None
    assert "5 elements in one item, over the model's limit of 4" in str(
        spec.limit_error((5,), [b""] * 5)
    )
    assert "an element of 101 bytes, over the model's limit of 100 bytes" in str(
        spec.limit_error((2,), [b"", b"x" * 101])
    )


def test_an_input_not_batched_by_length_says_so_and_others_say_nothing() -> None:
    images = Metadata(
        platform="test",
        inputs=(TensorSpec("image", "BYTES", (1,), batch_by_length=False), *DECLARED.inputs),
        outputs=DECLARED.outputs,
    )
    document = orjson.loads(orjson.dumps(ModelMetadata.served(images, "m", 8).encode()))
    assert [spec.get("batch_by_length") for spec in document["inputs"]] == [False, None]
    assert ModelMetadata.decode(document).inputs == images.inputs
    document["inputs"][0]["batch_by_length"] = "no"
    with pytest.raises(MetadataError, match="batch_by_length must be true or false"):
        ModelMetadata.decode(document)


def test_a_value_range_travels_with_its_input_and_refuses_what_lies_outside() -> None:
    ranged = Metadata(
        platform="test",
        inputs=(
            TensorSpec("temperature", "FP32", (1,), minimum=0, maximum=2.5),
            TensorSpec("scale", "BF16", (1,), minimum=1),
        ),
        outputs=DECLARED.outputs,
    )
    served = ModelMetadata.served(ranged, "m", 8)
    document = orjson.loads(orjson.dumps(served.encode()))
    assert document["inputs"][0]["minimum"] == 0 and document["inputs"][0]["maximum"] == 2.5
    temperature, scale = ModelMetadata.decode(document).inputs
    assert (temperature, scale) == ranged.inputs
    assert temperature.limit_error((1,), np.array([0, 1e-38, 2.5], np.float32)) is None
    for outside in (-1e-30, 2.6, np.inf, np.nan):
        error = temperature.limit_error((1,), np.array([1.0, outside], np.float32))
        assert error is not None and "outside the model's range [0, 2.5]" in error, outside
    # BF16 travels as the top 16 bits of a float32: 0.5 is 0x3F00, 2.0 is 0x4000.
    assert "value 0.5 is outside" in str(scale.limit_error((1,), np.array([0x3F00], np.uint16)))
    assert scale.limit_error((1,), np.array([0x4000], np.uint16)) is None


@pytest.mark.parametrize("name", sorted(BUILTIN_HANDLERS))
def test_every_built_in_handler_bounds_what_one_item_may_hold(name: str) -> None:
    # Fixed shapes bound themselves; anything else must declare its limit, so that the
    # sidecar refuses an item past it before the model server sees it.
    for spec in load_handler_class(name).metadata.inputs:
        if spec.variable:
            assert spec.max_elements is not None, f"{name}: input {spec.name!r}"
        if spec.datatype == "BYTES":
            assert spec.max_element_bytes is not None, f"{name}: input {spec.name!r}"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "max_element_bytes": 0}]},
            "max_element_bytes",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "max_elements": "9"}]},
            "max_elements",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "maximum": "high"}]},
            "maximum",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "minimum": 0}]},
            "BYTES input has no minimum",
        ),
        ({"max_batch_size": "lots"}, "lots"),
        ({"inputs": [{"name": "x", "datatype": "FP128", "shape": [1]}]}, "FP128"),
        ({"outputs": [{"name": "y", "shape": [1]}]}, "datatype"),
        ({"pads_variable_dims": "yes"}, "pads_variable_dims"),
    ],
)
def test_a_malformed_document_names_what_is_wrong(change: dict[str, Any], words: str) -> None:
    document = {**ModelMetadata.served(DECLARED, "m", 8).encode(), **change}
    with pytest.raises(MetadataError, match=words):
        ModelMetadata.decode(document)


@pytest.mark.parametrize("name", sorted(BUILTIN_HANDLERS))
def test_every_built_in_name_is_a_handler(name: str) -> None:
    handler_class = load_handler_class(name)
    assert issubclass(handler_class, Handler)
    assert isinstance(handler_class.metadata, Metadata)
