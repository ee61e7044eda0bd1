"""Payload bodies: what a server receives for each protocol and payload."""

from __future__ import annotations

import struct

import numpy as np
import orjson

from carpool.loadgen import workload


def test_text_workload_varies_lengths_and_is_repeatable() -> None:
    spec = workload.WorkloadSpec(payload="text", model_name="m", input_name="text", seed=3)
    first = workload.build(spec)
    assert [r.body for r in first] == [r.body for r in workload.build(spec)]
    lengths = {len(orjson.loads(r.body)["inputs"][0]["data"][0]) for r in first}
    assert len(lengths) > 10
    long_spec = workload.WorkloadSpec(payload="text", text_length="long", variants=4)
    words = [
        len(orjson.loads(r.body)["inputs"][0]["data"][0].split()) for r in workload.build(long_spec)
    ]
    assert min(words) > 80


def test_oip_json_carries_the_batch_dimension() -> None:
    [request] = workload.build(
        workload.WorkloadSpec(model_name="toy", batch_per_request=5, input_shape=(2, 3), variants=1)
    )
    assert request.path == "/v2/models/toy/infer"
    assert request.items == 5
    [tensor] = orjson.loads(request.body)["inputs"]
    assert tensor["name"] == "input" and tensor["datatype"] == "FP32"
    assert tensor["shape"] == [5, 2, 3] and len(tensor["data"]) == 30


def test_oip_binary_splits_json_header_from_raw_tensor() -> None:
    batch = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = workload.encode("oip-binary", "toy", "input", batch)
    split = int(request.headers["Inference-Header-Content-Length"])
    header = orjson.loads(request.body[:split])
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 32}
    assert np.array_equal(np.frombuffer(request.body[split:], "<f4").reshape(2, 4), batch)

    texts = workload.encode("oip-binary", "m", "text", ["hé", "abc"])
    split = int(texts.headers["Inference-Header-Content-Length"])
    raw = texts.body[split:]
    assert raw == struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 3) + b"abc"


def test_kserve_v1_sends_one_instance_per_item() -> None:
    request = workload.encode("kserve-v1", "toy", "input", np.ones((3, 4), dtype=np.float32))
    assert request.path == "/v1/models/toy:predict"
    assert orjson.loads(request.body) == {"instances": [[1.0] * 4] * 3}
