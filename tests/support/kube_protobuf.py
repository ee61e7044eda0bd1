"""Just enough of Kubernetes' protobuf encoding to read what helm writes: Secrets and ConfigMaps.

client-go's typed clients send built-in objects as `application/vnd.kubernetes.protobuf`
(the envelope `k8s\\0` + runtime.Unknown{typeMeta, raw}). helm stores its releases that way.
Only the fields helm sets are decoded: metadata (name, generateName, namespace,
resourceVersion, labels, annotations, finalizers), Secret data/stringData/type/immutable and
ConfigMap data/binaryData/immutable. Answers go back as JSON, which those clients accept.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, position


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs; varints as int, length-delimited as bytes."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(data, position)
            yield number, value
        elif wire == 2:
            length, position = _varint(data, position)
            yield number, data[position : position + length]
            position += length
        elif wire in (1, 5):
            position += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _entry(data: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, item in _fields(data):
        if number == 1 and isinstance(item, bytes):
            key = item.decode()
        elif number == 2 and isinstance(item, bytes):
            value = item
    return key, value


def _metadata(data: bytes) -> dict[str, Any]:
    names = {1: "name", 2: "generateName", 3: "namespace", 6: "resourceVersion"}
    maps = {11: "labels", 12: "annotations"}
    metadata: dict[str, Any] = {}
    for number, item in _fields(data):
        if not isinstance(item, bytes):
            continue
        if number in names and item:  # gogo-protobuf writes empty strings too
            metadata[names[number]] = item.decode()
        elif number in maps:
            key, value = _entry(item)
            metadata.setdefault(maps[number], {})[key] = value.decode()
        elif number == 14:
            metadata.setdefault("finalizers", []).append(item.decode())
    return metadata


def _secret(data: bytes) -> dict[str, Any]:
    secret: dict[str, Any] = {}
    for number, item in _fields(data):
        if number == 1 and isinstance(item, bytes):
            secret["metadata"] = _metadata(item)
        elif number == 2 and isinstance(item, bytes):
            key, value = _entry(item)
            secret.setdefault("data", {})[key] = base64.b64encode(value).decode()
        elif number == 3 and isinstance(item, bytes) and item:
            secret["type"] = item.decode()
        elif number == 4 and isinstance(item, bytes):
            key, value = _entry(item)
            secret.setdefault("stringData", {})[key] = value.decode()
        elif number == 5:
            secret["immutable"] = bool(item)
    return secret


def _config_map(data: bytes) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for number, item in _fields(data):
        if number == 1 and isinstance(item, bytes):
            config["metadata"] = _metadata(item)
        elif number == 2 and isinstance(item, bytes):
            key, value = _entry(item)
            config.setdefault("data", {})[key] = value.decode()
        elif number == 3 and isinstance(item, bytes):
            key, value = _entry(item)
            config.setdefault("binaryData", {})[key] = base64.b64encode(value).decode()
        elif number == 4:
            config["immutable"] = bool(item)
    return config


DECODERS = {"Secret": _secret, "ConfigMap": _config_map}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded Secret or ConfigMap as JSON-like data; ValueError for anything else."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf envelope")
    api_version = kind = ""
    raw = b""
    for number, item in _fields(body[len(MAGIC) :]):
        if number == 1 and isinstance(item, bytes):
            for type_number, value in _fields(item):
                if type_number == 1 and isinstance(value, bytes):
                    api_version = value.decode()
                elif type_number == 2 and isinstance(value, bytes):
                    kind = value.decode()
        elif number == 2 and isinstance(item, bytes):
            raw = item
    if kind not in DECODERS:
        raise ValueError(f"protobuf bodies of {kind or 'unknown kinds'} are not supported")
    return {"apiVersion": api_version or "v1", "kind": kind, **DECODERS[kind](raw)}
