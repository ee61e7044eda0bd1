"""Request and response bodies: OIP v2 JSON and binary, BYTES, BF16, and the config file."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.memory import peak_bytes

from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.engine.bounds import UNBOUNDED, RequestBounds
from carpool.engine.errors import BadRequest, PayloadTooLarge
from carpool.engine.settings import BatchingSettings, ConfigError, apply_file
from carpool_sidecar import counting, kserve_v1, oip_generate
from carpool_sidecar.generation import GenerateRequest
from carpool_sidecar.inference import InferResponse
from carpool_sidecar.oip import HEADER_LENGTH, encode_response, parse_request
from carpool_sidecar.tensors import (
    RequestTensor,
    bf16_to_float32,
    float32_to_bf16,
    length_prefixed,
    split,
    stack,
)


def binary_request(header: dict[str, object], *buffers: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(buffers), len(head)


def test_json_nested_and_flat_data_agree() -> None:
    flat = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}]}
    nested = {
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]
    }
    for document in (flat, nested):
        tensor = parse_request(orjson.dumps(document), None).inputs[0]
        assert isinstance(tensor.data, np.ndarray)
        assert tensor.data.tolist() == [1, 2, 3, 4] and tensor.data.dtype == np.int32


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT32", [1.5, 2, 3, 4], "does not fit INT32"),
        ("INT8", [1, 2, 3, 300], "out of range"),
        ("FP32", ["a", "b", "c", "d"], "does not fit FP32"),
        ("FP32", [1, 2, 3], "needs 4 elements, got 3"),
        ("BYTES", [1, 2, 3, 4], "must be strings"),
        ("BYTES", [["a", "b", "c"], ["d"]], "must be strings"),
        ("BYTES", [["a", "b"], ["c"]], "needs 4 elements, got 3"),
        ("FP32", [[1, 2, 3], [4]], "not a regular array"),
        ("FP32", [[1, 2], [3]], "needs 4 elements, got 3"),
        ("FP99", [1, 2, 3, 4], "unknown datatype"),
        ("UINT64", [0, 1, 2**63, -1], "out of range"),
        ("INT64", [0, 1, 2**63, 2], "out of range"),
        ("UINT64", [0, 1, 2**63, 1.5], "does not fit UINT64"),
        # A finite number past the type's range would be infinite: refused, not made inf.
        ("FP32", [0, 1, 1e300, 2], "out of range for FP32"),
        ("FP16", [0, 1, 70000, 2], "out of range for FP16"),
        ("BF16", [0, 1, -1e300, 2], "out of range for BF16"),
        # Finite as FP32, past BF16's largest (3.3895e38) by over half a step: rounds to inf.
        ("BF16", [0, 1, 3.4e38, 2], "out of range for BF16"),
    ],
)
def test_json_data_that_does_not_fit_is_refused(
    datatype: str, data: list[object], message: str
) -> None:
    document = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 4], "data": data}]}
    with pytest.raises(BadRequest, match=message):
        parse_request(orjson.dumps(document), None)


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("UINT64", [0, 1, 2**63, 2**64 - 1]),
        ("INT64", [-(2**63), -1, 0, 2**63 - 1]),
        ("UINT64", [0, 1, 2, 3]),
    ],
)
def test_json_64_bit_integers_are_exact_across_the_whole_range(
    datatype: str, values: list[int]
) -> None:
    document = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 4], "data": values}]}
    tensor = parse_request(orjson.dumps(document), None).inputs[0]
    assert isinstance(tensor.data, np.ndarray) and tensor.data.dtype.kind in "iu"
    assert tensor.data.tolist() == values


def test_kserve_v1_64_bit_integers_are_exact() -> None:
    spec = TensorSpec("x", "UINT64", (1,))
    metadata = ModelMetadata(
        name="m", platform="p", inputs=(spec,), outputs=(spec,), max_batch_size=8
    )
    body = orjson.dumps({"instances": [0, 1, 2**63]})
    tensor = kserve_v1.parse_request(body, metadata, UNBOUNDED).inputs[0]
    assert isinstance(tensor.data, np.ndarray) and tensor.data.tolist() == [0, 1, 2**63]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"datatype": "FP32", "shape": [9, 4], "data": []}, "9 items, more than maxQueueItems 8"),
        ({"datatype": "FP32", "shape": [2, 10**6], "data": []}, "8000000 bytes"),
        (
            {"datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 10**6}},
            "1000000 bytes",
        ),
    ],
)
def test_declared_items_and_bytes_are_bounded_before_the_data_is_read(
    header: dict[str, object], message: str
) -> None:
    """The data does not even match the shape: the bound is checked first, from the header."""
    document = {"inputs": [{"name": "x", **header}]}
    with pytest.raises(PayloadTooLarge, match=message):
        parse_request(orjson.dumps(document), None, RequestBounds(max_items=8, max_bytes=4096))


def json_body(
    datatype: str, shape: list[int], data_text: bytes, shape_key: bytes = b"shape"
) -> bytes:
    head = b'{"inputs": [{"name": "x", "datatype": "%s", "%s": %s, "data": ' % (
        datatype.encode(),
        shape_key,
        orjson.dumps(shape),
    )
    return head + data_text + b"}]}"


@pytest.mark.parametrize(
    ("datatype", "data_text", "message"),
    [
        ("FP32", b"[" + b"1.5," * 1_000_000 + b"0]", "needs 4 elements, got 1000001"),
        ("FP32", b"[[" + b"[0,1]," * 500_000 + b"[0,1]]]", "needs 4 elements, got 1000002"),
        ("BYTES", b"[" + b'"",' * 1_000_000 + b'""]', "needs 4 elements, got 1000001"),
        ("BYTES", b"[" + b'"a\\\\",' * 500_000 + b'"\\""]', "needs 4 elements, got 500001"),
        ("FP32", b"[" + b'"1",' * 1_000_000 + b'"0"]', "data holding strings does not fit FP32"),
        ("FP32", b"[" + b"[]," * 1_000_000 + b"[1,2,3,4]]", "1000002 arrays, more than"),
    ],
)
def test_json_data_beyond_its_shape_is_refused_before_it_is_converted(
    datatype: str, data_text: bytes, message: str
) -> None:
    """Converted, a million elements would take a Python object each (tens of MB); counted
    from the text they take a copy of it at most."""
    body = json_body(datatype, [1, 4], data_text)
    peak, raised = peak_bytes(lambda: parse_request(body, None))
    assert isinstance(raised, BadRequest) and message in raised.message
    assert peak < 2.5 * len(body), f"{peak >> 20} MiB for a {len(body) >> 20} MiB body"


def test_an_escaped_key_declares_the_shape_it_spells() -> None:
    """`sha\\u0070e` is `shape` to a JSON parser: 1,000,000 declared rows are refused
    before the data is converted, however the key is written."""
    body = json_body("FP32", [1_000_000, 4], b"[" + b"0," * 3_999_999 + b"0]", rb"sha\u0070e")
    bounds = RequestBounds(max_items=1024, max_bytes=2**30)
    peak, raised = peak_bytes(lambda: parse_request(body, None, bounds))
    assert isinstance(raised, PayloadTooLarge), raised
    assert "1000000 items, more than maxQueueItems 1024" in raised.message
    assert peak < 1.5 * len(body), f"{peak >> 20} MiB for a {len(body) >> 20} MiB body"


INPUT = b'{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}'
ZEROS = b"[" + b"0," * 999_999 + b"0]"


@pytest.mark.parametrize(
    ("body", "message", "most"),
    [
        (b'{"inputs": [' + b"{}," * 1_000_000 + INPUT + b"]}", "objects, more than", 3.5),
        (b'{"inputs": [' + INPUT + b'], "outputs": [' + b"{}," * 999_999 + b"{}]}", "objects", 3.5),
        (
            b'{"inputs": [' + INPUT + b'], "parameters": {"priority": ' + ZEROS + b"}}",
            "priority",
            1.5,
        ),
        (b'{"inputs": [{"name": ' + ZEROS + b', "datatype": "FP32"}]}', "name", 1.5),
        (INPUT.replace(b"[1, 4]", b"[1, " + b"1, " * 1_000_000 + b"4]"), "64 dimensions", 1.5),
        (
            INPUT.replace(b'"data"', b'"parameters": {"binary_data_size": %s}, "d"' % ZEROS),
            "size",
            1.5,
        ),
    ],
)
def test_the_json_around_the_data_is_bounded_before_it_is_decoded(
    body: bytes, message: str, most: float
) -> None:
    """Outside `data` a request holds a few names, shapes and parameters: a body that holds
    a million of something there is refused holding no object per element (an object
    each would take 20 times the body or more), with at most a few copies of its text."""
    if not body.startswith(b'{"inputs"'):
        body = b'{"inputs": [' + body + b"]}"
    peak, raised = peak_bytes(lambda: parse_request(body, None))
    assert isinstance(raised, BadRequest) and message in raised.message, raised
    assert peak < most * len(body), f"{peak >> 20} MiB for a {len(body) >> 20} MiB body"


def test_unknown_parameters_are_skipped_without_objects() -> None:
    keys = b", ".join(b'"k%d": [0]' % index for index in range(300_000))
    body = b'{"inputs": [' + INPUT + b'], "parameters": {' + keys + b', "priority": 2}}'
    peak, raised = peak_bytes(lambda: parse_request(body, None))
    assert raised is None and peak < len(body) / 4, f"{peak >> 20} MiB, {raised}"
    assert parse_request(body, None).priority == 2


def test_binary_bytes_beyond_the_shape_are_refused_before_they_are_cut() -> None:
    raw = struct.pack("<I", 0) * 1_000_000
    header = {
        "inputs": [
            {
                "name": "t",
                "datatype": "BYTES",
                "shape": [1, 4],
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    body, length = binary_request(header, raw)
    peak, raised = peak_bytes(lambda: parse_request(body, length))
    assert isinstance(raised, BadRequest) and "more than the 4 elements" in raised.message
    assert peak < len(body) / 8, f"{peak >> 20} MiB for a {len(body) >> 20} MiB body"


JSON_SCALARS = st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)


def nested(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=20)


def flat_count(value: Any) -> int:
    return sum(map(flat_count, value)) if isinstance(value, list) else 1


def array_count(value: Any) -> int:
    return 1 + sum(map(array_count, value)) if isinstance(value, list) else 0


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_json_data_nesting_more_arrays_than_its_shape_is_refused(datatype: str) -> None:
    data = [[[]], [[]], ["a", "b"]] if datatype == "BYTES" else [[[]], [[]], [1, 2]]
    document = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 1], "data": data}]}
    with pytest.raises(BadRequest, match="data holds 6 arrays, more than its shape"):
        parse_request(orjson.dumps(document), None)


@pytest.mark.parametrize(
    ("shape", "data"),
    [
        ([2, 2], [[1, 2], [3, 4]]),
        ([2, 2], [1, 2, 3, 4]),
        ([4], [[1], [2], [3], [4]]),
        ([1, 2, 1], [[[1], [2]]]),
        ([1, 0], [[]]),
    ],
)
def test_json_data_nested_as_its_shape_or_flatter_is_read(shape: list[int], data: Any) -> None:
    document = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}
    tensor = parse_request(orjson.dumps(document), None).inputs[0]
    assert tensor.shape == tuple(shape) and tensor.data.size == flat_count(data)


@given(nested(JSON_SCALARS | st.booleans()), st.sampled_from([b"", b" ", b"\n\t "]))
def test_counting_numbers_agrees_with_a_parser(value: Any, space: bytes) -> None:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2).replace(b"\n", space)
    assert counting.elements("x", "FP64", text, -1, strings=False) == (
        flat_count(value),
        array_count(value),
    )


@given(nested(st.text(alphabet=st.sampled_from('ab ,[]"\\{}\n\u00e9'))))
def test_counting_strings_agrees_with_a_parser(value: Any) -> None:
    """Quotes, backslashes, commas and brackets inside the strings count for nothing."""
    text = orjson.dumps(value)
    count = flat_count(value)
    assert counting.elements("x", "BYTES", text, count, strings=True) == (count, array_count(value))


@given(
    st.lists(nested(JSON_SCALARS) | nested(st.text(alphabet=st.sampled_from('a ,[]"\\')))),
    st.sampled_from([b"", b" "]),
)
def test_counting_the_outer_elements_agrees_with_a_parser(value: list[Any], space: bytes) -> None:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2).replace(b"\n", space)
    strings = any(isinstance(each, str) for each in flat(value))
    assert counting.outer(text, strings) == len(value)


def flat(value: Any) -> list[Any]:
    return [leaf for each in value for leaf in flat(each)] if isinstance(value, list) else [value]


def test_binary_inputs_are_read_in_order_without_copies() -> None:
    floats = np.arange(6, dtype="<f4")
    texts = [b"hello", b"", b"carpool"]
    sizes = [{"binary_data_size": 24}, {"binary_data_size": len(length_prefixed(texts))}]
    header = {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [3, 2], "parameters": sizes[0]},
            {"name": "t", "datatype": "BYTES", "shape": [3, 1], "parameters": sizes[1]},
        ],
        "parameters": {"binary_data_output": True, "priority": 3, "timeout": 250_000},
    }
    body, length = binary_request(header, floats.tobytes(), length_prefixed(texts))
    request = parse_request(body, length)
    a, t = request.inputs
    assert isinstance(a.data, np.ndarray) and a.data.tolist() == floats.tolist()
    assert t.data == texts
    assert request.binary_output and request.priority == 3 and request.timeout_ms == 250


@pytest.mark.parametrize("extra", [b"", b"xx"])
def test_binary_sizes_must_add_up(extra: bytes) -> None:
    header = {
        "inputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {"binary_data_size": 8},
            }
        ]
    }
    body, length = binary_request(header, bytes(8 if extra else 4), extra)
    with pytest.raises(BadRequest):
        parse_request(body, length)


def test_truncated_bytes_element_is_refused() -> None:
    raw = struct.pack("<I", 10) + b"short"
    header = {
        "inputs": [
            {
                "name": "t",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    body, length = binary_request(header, raw)
    with pytest.raises(BadRequest, match="runs past"):
        parse_request(body, length)


def test_bf16_rounds_to_nearest_and_back() -> None:
    values = np.array([1.0, -2.5, 3.14159, 1e-3], dtype=np.float32)
    back = bf16_to_float32(float32_to_bf16(values))
    assert np.allclose(back, values, rtol=1 / 128)
    assert float32_to_bf16(np.array([1.0], dtype=np.float32)).tolist() == [0x3F80]


def test_split_then_stack_round_trips() -> None:
    tensor = RequestTensor("x", "FP32", (3, 2), np.arange(6, dtype="<f4"))
    parts = split(tensor)
    assert [part.to_numpy().tolist() for part in parts] == [[0, 1], [2, 3], [4, 5]]
    again = stack("x", parts)
    assert again.shape == (3, 2) and isinstance(again.data, np.ndarray)
    assert again.data.tolist() == [0, 1, 2, 3, 4, 5]


def test_binary_response_has_header_length_and_raw_data() -> None:
    out = RequestTensor("y", "FP16", (2,), np.array([1.5, 2.0], dtype="<f2"))
    text = RequestTensor("s", "BYTES", (1,), [b"ok"])
    parts, headers = encode_response(InferResponse("m", "r1", [out, text], frozenset(["y"])))
    body = b"".join(parts)
    length = int(headers[HEADER_LENGTH])
    header = orjson.loads(body[:length])
    assert header["id"] == "r1" and header["model_name"] == "m"
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 4
    assert header["outputs"][1]["data"] == ["ok"]
    assert np.frombuffer(body[length:], "<f2").tolist() == [1.5, 2.0]


def test_settings_file_overrides_and_names_bad_keys() -> None:
    base = BatchingSettings(max_batch_size=8)
    assert apply_file(base, b'{"maxBatchSize": 16, "dispatch": "fixed"}') == BatchingSettings(
        max_batch_size=16, dispatch="fixed"
    )
    for content, message in [
        (b'{"maxBatchSize": 0}', "maxBatchSize.*0"),
        (b'{"maxBatchSize": 2.5}', "maxBatchSize.*2.5"),
        (b'{"dispatch": "eager"}', "dispatch.*eager"),
        (b'{"maxWait": 5}', "maxWait: unknown key"),
        (b"[1]", "JSON object"),
        (b"{", "not JSON"),
    ]:
        with pytest.raises(ConfigError, match=message):
            apply_file(base, content)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
INPUTS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "y"]) | JSON_VALUES,
        "datatype": st.sampled_from(["FP32", "INT8", "BYTES", "BF16", "BOOL", "FP16"])
        | JSON_VALUES,
        "shape": st.lists(st.integers(-1, 4), max_size=3) | JSON_VALUES,
    },
    optional={"data": JSON_VALUES, "parameters": JSON_VALUES},
)


@settings(max_examples=200, deadline=None)
@given(
    document=st.fixed_dictionaries(
        {"inputs": st.lists(INPUTS, max_size=3) | JSON_VALUES},
        optional={"outputs": JSON_VALUES, "parameters": JSON_VALUES, "id": JSON_VALUES},
    )
)
def test_any_json_body_is_parsed_or_refused_with_400(document: dict[str, object]) -> None:
    with contextlib.suppress(BadRequest):
        parse_request(orjson.dumps(document), None)


GENERATES = ModelMetadata(
    name="gen",
    platform="p",
    inputs=(
        TensorSpec("text_input", "BYTES", (1,), max_element_bytes=4096),
        TensorSpec("max_new_tokens", "INT32", (1,), minimum=1, maximum=255),
        TensorSpec("stop", "BYTES", (-1,), max_elements=16, max_element_bytes=256),
    ),
    outputs=(TensorSpec("text_output", "BYTES", (1,)),),
    max_batch_size=8,
)
STRINGS = b"[" + b'"a",' * 999_999 + b'"a"]'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"text_input": "hi", "parameters": {"stop": ' + STRINGS + b"}}", "max_elements"),
        (b'{"text_input": ' + STRINGS + b"}", "text_input"),
        (b'{"text_input": "hi", "parameters": {"max_tokens": ' + ZEROS + b"}}", "max_tokens"),
        (b'{"text_input": "hi", "junk": ' + STRINGS + b"}", ""),
    ],
)
def test_a_generate_body_is_bounded_before_it_is_decoded(body: bytes, message: str) -> None:
    """A generate request is one prompt and a few settings: a million stop strings, or of
    anything else, are refused (or skipped) holding no object each."""
    peak, raised = peak_bytes(lambda: oip_generate.parse_request(body, GENERATES))
    if message:
        assert isinstance(raised, BadRequest) and message in raised.message, raised
    else:
        assert raised is None
    assert peak < 1.5 * len(body), f"{peak >> 20} MiB for a {len(body) >> 20} MiB body"


def one_input(shape: tuple[int, ...], datatype: str = "FP32") -> ModelMetadata:
    spec = TensorSpec("x", datatype, shape)
    return ModelMetadata(name="m", platform="p", inputs=(spec,), outputs=(spec,), max_batch_size=8)


@pytest.mark.parametrize(
    ("shape", "instances", "error", "message"),
    [
        ((4,), b"[" + b"[0,0,0,0]," * 250_000 + b"[0,0,0,0]]", PayloadTooLarge, "250001 items"),
        ((-1,), b"[" + b"[0]," * 1_000_000 + b"[0]]", PayloadTooLarge, "1000001 items"),
        ((-1,), b"[[" + b"0," * 3_000_000 + b"0]]", PayloadTooLarge, "12000004 bytes"),
        ((-1,), b"[[" + b"[]," * 1_000_000 + b"[]]]", BadRequest, "1000003 arrays"),
        ((4,), b'[["a",' + b'"a",' * 1_000_000 + b'"a"]]', BadRequest, "does not fit FP32"),
        ((4,), b"[[" + b"0," * 1_000_000 + b"0]]", BadRequest, "hold 4 elements, got 1000001"),
    ],
)
def test_kserve_v1_instances_are_counted_before_they_are_converted(
    shape: tuple[int, ...], instances: bytes, error: type[Exception], message: str
) -> None:
    """v1 declares no shape: the instances are counted from their text (items, elements,
    arrays) against the model's input and the request bounds, holding no object each."""
    body = b'{"instances": ' + instances + b"}"
    bounds = RequestBounds(max_items=1024, max_bytes=8 << 20)
    peak, raised = peak_bytes(lambda: kserve_v1.parse_request(body, one_input(shape), bounds))
    assert isinstance(raised, error) and message in str(raised), raised
    assert peak < 2.5 * len(body), f"{peak >> 20} MiB for a {len(body) >> 20} MiB body"


@pytest.mark.parametrize(
    "body",
    [
        b'{"text_input": "a", "max_tokens": null, "parameters": {"max_tokens": 3}}',
        b'{"text_input": "a", "max_tokens": 3, "parameters": {"max_tokens": null}}',
        b'{"text_input": "a", "parameters": {"max_tokens": 3, "max_new_tokens": null}}',
    ],
)
def test_a_setting_given_as_null_beside_the_text_leaves_the_parameters_its_own(
    body: bytes,
) -> None:
    """null is "not given", beside `text_input` as among the parameters: a setting given
    once with a value and once as null is given once, and a null `max_new_tokens` is no
    use of the deprecated name. (Before, each was a 400: "give 'max_tokens' once", "give
    'max_tokens' only".)"""
    parsed = oip_generate.parse_request(body, GENERATES)
    assert parsed.max_tokens == 3 and parsed.deprecations == ()


def test_every_parameter_given_as_null_is_left_to_its_default() -> None:
    """A client that writes each parameter it leaves unset as null (many do) is answered
    with the defaults, not a 400 for the one parameter that took null for a value."""
    names = ["max_tokens", "temperature", "seed", "stop", "priority", "timeout"]
    body = orjson.dumps({"text_input": "a", "parameters": dict.fromkeys(names)})
    assert oip_generate.parse_request(body, GENERATES) == GenerateRequest("a")
