"""Open Inference Protocol REST requests, as a client sends them to a sidecar.

body, headers = bytes_request("image", data)     # one BYTES element, binary extension
body, headers = json_request("input", "FP32", [1, 3], [0.5, 1.0, 2.0])
"""

from __future__ import annotations

import struct

import orjson


def bytes_request(name: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    """One item of one BYTES element, carried raw in the binary data extension."""
    raw = struct.pack("<I", len(data)) + data
    tensor = {"name": name, "datatype": "BYTES", "shape": [1, 1]}
    header = orjson.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}]})
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + raw, headers


def json_request(
    name: str, datatype: str, shape: list[int], data: list[object]
) -> tuple[bytes, dict[str, str]]:
    """One input tensor, its data flat in JSON."""
    tensor = {"name": name, "datatype": datatype, "shape": shape, "data": data}
    return orjson.dumps({"inputs": [tensor]}), {"Content-Type": "application/json"}
