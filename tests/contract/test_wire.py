"""wire.py in process: round trips of every datatype family, and bodies it must refuse."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from carpool.contract import wire
from carpool.contract.wire import BYTES, ItemResult, Tensor, WireError


def round_trip_item(item: dict[str, Tensor]) -> dict[str, Tensor]:
    (decoded,) = wire.decode_request(wire.encode_request([item]))
    return decoded


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "bool"]
)
def test_numeric_round_trip(dtype: str) -> None:
    array = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    decoded = round_trip_item({"x": Tensor.from_numpy(array)})["x"]
    assert decoded.shape == (3, 4)
    np.testing.assert_array_equal(decoded.to_numpy(), array)
    assert decoded.to_numpy().dtype == array.dtype


def test_fp16_keeps_its_bits() -> None:
    array = np.array([0.1, -2.5, 65504.0, np.inf], dtype=np.float16)
    decoded = round_trip_item({"x": Tensor.from_numpy(array)})["x"]
    assert decoded.datatype == "FP16"
    assert decoded.to_numpy().tobytes() == array.tobytes()


def test_bf16_travels_as_words_torch_can_read() -> None:
    values = torch.tensor([1.0, -0.5, 3.140625, 1e30], dtype=torch.bfloat16)
    words = values.view(torch.int16).numpy().view(np.uint16)
    decoded = round_trip_item({"x": Tensor.from_numpy(words, "BF16")})["x"]
    assert decoded.datatype == "BF16"
    back = torch.from_numpy(decoded.to_numpy().copy().view(np.int16)).view(torch.bfloat16)
    assert torch.equal(back, values)


def test_bytes_round_trip_keeps_arbitrary_bytes() -> None:
    strings = [b"hello", "caf\u00e9".encode(), b"\x00\xff", b""]
    decoded = round_trip_item({"text": Tensor(BYTES, (4,), strings)})["text"]
    assert decoded.datatype == BYTES and decoded.data == strings


def test_response_round_trip_with_errors_in_order() -> None:
    results = [
        ItemResult(outputs={"y": Tensor.from_numpy(np.ones(2, dtype=np.float32))}),
        ItemResult.failed("bad item", 400),
        ItemResult.failed("model failed", 500),
    ]
    decoded = wire.decode_response(wire.encode_response(results))
    assert decoded[0].outputs is not None
    assert decoded[0].outputs["y"].to_numpy().tolist() == [1.0, 1.0]
    assert [(r.error, r.status) for r in decoded[1:]] == [("bad item", 400), ("model failed", 500)]


def test_a_response_carries_the_model_servers_timing_when_given() -> None:
    results = [ItemResult.failed("bad item", 400)]
    timing = wire.BatchTiming(queued_s=0.002, worker_s=0.031)
    assert wire.decode_answer(wire.encode_response(results, timing))[1] == timing
    # A model server that does not time its batches still answers.
    assert wire.decode_answer(wire.encode_response(results)) == (results, None)


@given(st.lists(st.lists(st.floats(width=32), max_size=5), max_size=6))
def test_any_fp32_batch_round_trips(rows: list[list[float]]) -> None:
    items = [{"v": Tensor.from_numpy(np.array(row, dtype=np.float32))} for row in rows]
    decoded = wire.decode_request(wire.encode_request(items))
    assert [d["v"].to_numpy().tobytes() for d in decoded] == [
        i["v"].to_numpy().tobytes() for i in items
    ]


def tensor_body(tensor: Any) -> bytes:
    return msgpack.packb({"items": [{"inputs": {"x": tensor}}]})


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([1, 2]), "'items'"),
        (msgpack.packb({"items": [1]}), "inputs"),
        (msgpack.packb({"items": [{"inputs": [1]}]}), "map of name"),
        (tensor_body({"datatype": "FP32", "shape": [2]}), "malformed tensor"),
        (tensor_body({"datatype": "FP8", "shape": [1], "data": b"a"}), "unknown datatype"),
        (tensor_body({"datatype": "FP32", "shape": [2], "data": b"\0" * 4}), "needs 2"),
        (tensor_body({"datatype": "FP32", "shape": [1], "data": b"\0" * 5}), "whole number"),
        (tensor_body({"datatype": "FP32", "shape": [-1], "data": b""}), "negative"),
        (tensor_body({"datatype": "FP32", "shape": {"1": 0}, "data": b"\0" * 4}), "shape must"),
        (tensor_body({"datatype": "FP32", "shape": "1", "data": b"\0" * 4}), "shape must"),
        (tensor_body({"datatype": "BYTES", "shape": [1], "data": b"abc"}), "list of byte"),
        (tensor_body({"datatype": "BYTES", "shape": [2], "data": ["text", 5]}), "list of byte"),
        (tensor_body({"datatype": "FP32", "shape": [1], "data": [b"abcd"]}), "byte buffer"),
    ],
)
def test_malformed_requests_are_refused(body: bytes, words: str) -> None:
    with pytest.raises(WireError, match=words):
        wire.decode_request(body)


# Any value msgpack can carry, nested: what a broken or hostile model server might answer.
ANY_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
RESULT = st.fixed_dictionaries(
    {},
    optional={
        "error": ANY_VALUE,
        "status": ANY_VALUE,
        "outputs": ANY_VALUE
        | st.dictionaries(
            st.text(max_size=4),
            st.fixed_dictionaries(
                {}, optional={"datatype": ANY_VALUE, "shape": ANY_VALUE, "data": ANY_VALUE}
            ),
        ),
    },
)


@given(
    st.fixed_dictionaries(
        {"results": st.lists(RESULT | ANY_VALUE, max_size=3)},
        optional={"queued_s": ANY_VALUE, "worker_s": ANY_VALUE},
    )
    | ANY_VALUE
)
def test_any_answer_decodes_or_is_a_wire_error(document: Any) -> None:
    """A model server's answer is input: whatever it holds, decoding gives results or a
    WireError (which the sidecar answers with 502), never another exception."""
    try:
        results, _ = wire.decode_answer(msgpack.packb(document, use_bin_type=True))
    except WireError:
        return
    for result in results:
        assert isinstance(result.status, int) and not isinstance(result.status, bool)
        assert result.error is None or isinstance(result.error, str)


@pytest.mark.parametrize("status", ["418", 4.5, True, None, [500]])
def test_an_error_status_that_is_no_http_status_is_a_wire_error(status: object) -> None:
    body = msgpack.packb({"results": [{"error": "no", "status": status}]})
    with pytest.raises(WireError, match="status"):
        wire.decode_answer(body)


# FP32 tensors of shape [2], some with a byte too many or an element too many or few.
FP32_PAIR = st.builds(
    lambda size: {"x": {"datatype": "FP32", "shape": [2], "data": b"\1" * size}},
    st.sampled_from([8, 8, 8, 9, 4, 12]),
)


@given(st.lists(FP32_PAIR | st.builds(lambda: {"x": {"datatype": "BYTES", "shape": [1]}})))
def test_a_batch_decodes_as_its_items_would_alone(items: list[dict[str, Any]]) -> None:
    """The checks done once per kind of tensor in a batch refuse what the check of each item
    alone does: a tensor whose data does not fit is refused after one of its kind that did."""
    alone: list[dict[str, Tensor]] = []
    refused = None
    for raw in items:
        try:
            (decoded,) = wire.decode_request(msgpack.packb({"items": [{"inputs": raw}]}))
        except WireError as error:
            refused = str(error)
            break
        alone.append(decoded)
    body = msgpack.packb({"items": [{"inputs": raw} for raw in items]})
    if refused is not None:
        with pytest.raises(WireError) as raised:
            wire.decode_request(body)
        assert str(raised.value) == refused
    else:
        assert wire.decode_request(body) == alone


def test_a_batch_of_mixed_datatypes_and_shapes_keeps_each_items_own() -> None:
    items = [
        {"x": Tensor.from_numpy(np.arange(4, dtype=np.float32))},
        {"x": Tensor.from_numpy(np.arange(4, dtype=np.int32))},
        {"x": Tensor.from_numpy(np.arange(4, dtype=np.float32).reshape(2, 2))},
        {"x": Tensor.from_numpy(np.arange(2, dtype=np.float64))},
        {"x": Tensor.from_numpy(np.arange(4, dtype=np.float32) + 1)},
    ]
    decoded = wire.decode_request(wire.encode_request(items))
    assert [(d["x"].datatype, d["x"].shape) for d in decoded] == [
        ("FP32", (4,)),
        ("INT32", (4,)),
        ("FP32", (2, 2)),
        ("FP64", (2,)),
        ("FP32", (4,)),
    ]
    for got, sent in zip(decoded, items, strict=True):
        np.testing.assert_array_equal(got["x"].to_numpy(), sent["x"].to_numpy())


def packed_tensor(tensor: Tensor) -> dict[str, Any]:
    return {"datatype": tensor.datatype, "shape": list(tensor.shape), "data": tensor.data}


@pytest.mark.parametrize("count", [1, 15, 16, 70, 70_000])
def test_bodies_are_the_bytes_msgpack_writes_for_the_documented_documents(count: int) -> None:
    """Whatever the counts and sizes (msgpack's fix, 16- and 32-bit headers), a body is
    what any msgpack library writes for the document docs/wire-format.md describes."""
    many = np.arange(count, dtype=np.float32)
    # Outputs as a handler's `output_rows` gives them: views of one buffer.
    rows = memoryview(np.arange(2 * count, dtype=np.int64).tobytes())
    outputs = [{"y": Tensor("INT64", (2,), rows[16 * i : 16 * (i + 1)])} for i in range(count)]
    item = {
        "x": Tensor.from_numpy(many),  # a buffer of count * 4 bytes: bin 8, 16 or 32
        "text": Tensor(BYTES, (2,), [b"a", b"b" * 300]),
        "listed": Tensor("INT8", [1], b"\1"),  # type: ignore[arg-type]  # a handler's list
        **{f"k{index}": Tensor.from_numpy(np.ones(1, np.uint8)) for index in range(count % 17)},
    }
    items = [item] * min(count, 20)
    expected = {"items": [{"inputs": {k: packed_tensor(t) for k, t in i.items()}} for i in items]}
    assert wire.encode_request(items) == msgpack.packb(expected, use_bin_type=True)

    results = [ItemResult(outputs=row) for row in outputs]
    results[len(results) // 2] = ItemResult.failed("bad item", 400)
    timing = wire.BatchTiming(0.001, 0.25)
    documents = [
        {"outputs": {k: packed_tensor(t) for k, t in (r.outputs or {}).items()}}
        if r.error is None
        else {"error": r.error, "status": r.status}
        for r in results
    ]
    expected_answer = {"results": documents, "queued_s": 0.001, "worker_s": 0.25}
    assert wire.encode_response(results, timing) == msgpack.packb(expected_answer)
    assert wire.encode_response(results) == msgpack.packb({"results": documents})
