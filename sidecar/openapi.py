"""The OpenAPI 3.1 description of the sidecar's HTTP API, served at `GET /openapi.json`.

Written by hand to match `app.py`'s routes and `errors.py`'s statuses, so that generic clients
and API fuzzers (schemathesis in `tests/reliability/`) can check the sidecar against it.
`docs/sidecar.md` is the prose version.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _error(description: str, headers: Schema | None = None) -> Schema:
    response: Schema = {"description": description, "content": _json(_ref("Error"))}
    if headers:
        response["headers"] = headers
    return response


NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The model's name (`--model-name`).",
}
VERSION = {
    "name": "version",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": 'The model version; the sidecar serves one, "1".',
}
TIMEOUT = {
    "name": "X-Carpool-Timeout-Ms",
    "in": "header",
    "required": False,
    "schema": {"type": "number", "exclusiveMinimum": 0},
    "description": "A deadline in milliseconds, shorter than the configured timeoutMs.",
}
HEADER_LENGTH = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "schema": {"type": "integer", "minimum": 1},
    "description": "Binary tensor data extension: the length of the JSON header; raw "
    "tensor data follows it.",
}

# Errors every inference request can meet, whatever its body.
INFER_ERRORS: Schema = {
    "400": _error("Malformed request, or an item the model refused as invalid."),
    "404": _error("Unknown model name or version."),
    "413": _error("Body above --max-body-bytes, or more items than maxQueueItems."),
    "429": _error(
        "The queue is full; nothing was queued.",
        {
            "Retry-After": {
                "description": "Seconds until the queue has likely drained (1 to 60).",
                "required": True,
                "schema": {"type": "integer", "minimum": 1, "maximum": 60},
            }
        },
    ),
    "500": _error("The model failed on one of this request's items, or a sidecar bug."),
    "502": _error("The model server answered with a malformed batch."),
    "503": _error(
        "The model server is not ready or failed the batch, or the sidecar is shutting down."
    ),
    "504": _error("The request's deadline passed."),
}

SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    },
    "Parameters": {
        "type": "object",
        "description": "Request parameters; unknown keys are ignored.",
        "properties": {
            "priority": {"type": "integer", "description": "Higher is served first."},
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "Deadline in milliseconds.",
            },
            "binary_data_output": {"type": "boolean"},
        },
    },
    "RequestInput": {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": {"enum": DATATYPES},
            "shape": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            "parameters": {
                "type": "object",
                "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
            },
            "data": {
                "description": "Flat or nested values of the datatype; absent when "
                "the data is binary."
            },
        },
    },
    "RequestedOutput": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}},
        },
    },
    "InferenceRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": _ref("Parameters"),
            "inputs": {"type": "array", "minItems": 1, "items": _ref("RequestInput")},
            "outputs": {"type": "array", "items": _ref("RequestedOutput")},
        },
    },
    "ResponseOutput": {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": {"enum": DATATYPES},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "data": {"type": "array"},
            "parameters": {
                "type": "object",
                "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
            },
        },
    },
    "InferenceResponse": {
        "type": "object",
        "required": ["model_name", "model_version", "outputs"],
        "properties": {
            "id": {"type": "string"},
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "outputs": {"type": "array", "items": _ref("ResponseOutput")},
        },
    },
    "TensorMetadata": {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": {"enum": DATATYPES},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": -1}},
        },
    },
    "ModelMetadata": {
        "type": "object",
        "required": ["name", "versions", "platform", "inputs", "outputs"],
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": _ref("TensorMetadata")},
            "outputs": {"type": "array", "items": _ref("TensorMetadata")},
        },
    },
    "ModelReady": {
        "type": "object",
        "required": ["name", "ready"],
        "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
    },
    "PredictRequest": {
        "type": "object",
        "required": ["instances"],
        "properties": {"instances": {"type": "array", "minItems": 1}},
    },
    "PredictResponse": {
        "type": "object",
        "required": ["predictions"],
        "properties": {"predictions": {"type": "array"}},
    },
}


def _infer(summary: str, parameters: list[Schema]) -> Schema:
    return {
        "post": {
            "summary": summary,
            "parameters": [*parameters, TIMEOUT, HEADER_LENGTH],
            "requestBody": {
                "required": True,
                "content": {
                    **_json(_ref("InferenceRequest")),
                    "application/octet-stream": {
                        "schema": {"type": "string", "format": "binary"},
                        "description": "A JSON header of Inference-Header-Content-Length "
                        "bytes, then raw tensor data.",
                    },
                },
            },
            "responses": {
                "200": {
                    "description": "One result per item, in order.",
                    "content": {
                        **_json(_ref("InferenceResponse")),
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                    },
                },
                **INFER_ERRORS,
            },
        }
    }


def _get(summary: str, parameters: list[Schema], ok: Schema, errors: Schema) -> Schema:
    return {
        "get": {
            "summary": summary,
            "parameters": parameters,
            "responses": {"200": {"description": "OK", "content": _json(ok)}, **errors},
        }
    }


READY_ERRORS = {
    "404": _error("Unknown model name or version."),
    "503": {"description": "Not ready.", "content": _json(_ref("ModelReady"))},
}
METADATA_ERRORS = {
    "404": _error("Unknown model name or version."),
    "503": _error("The model server is not ready."),
}


def document(version: str) -> Schema:
    """The OpenAPI document, with the sidecar's version in `info`."""
    live = {"type": "object", "required": ["live"], "properties": {"live": {"type": "boolean"}}}
    ready = {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "carpool sidecar",
            "version": version,
            "description": "Dynamic batching in front of a model server: Open Inference "
            "Protocol v2 with the binary tensor data extension, and KServe v1.",
        },
        "paths": {
            "/v2/health/live": _get(
                "Live while the process serves.",
                [],
                live,
                {"503": {"description": "Broken: restart me.", "content": _json(live)}},
            ),
            "/v2/health/ready": _get(
                "Ready while the model server is and the sidecar is not shutting down.",
                [],
                ready,
                {"503": {"description": "Not ready.", "content": _json(ready)}},
            ),
            "/v2": _get(
                "Server metadata.",
                [],
                {"type": "object", "required": ["name", "version", "extensions"]},
                {},
            ),
            "/v2/models/{name}": _get(
                "Model metadata.", [NAME], _ref("ModelMetadata"), METADATA_ERRORS
            ),
            "/v2/models/{name}/versions/{version}": _get(
                "Model metadata.", [NAME, VERSION], _ref("ModelMetadata"), METADATA_ERRORS
            ),
            "/v2/models/{name}/ready": _get(
                "Model readiness.", [NAME], _ref("ModelReady"), READY_ERRORS
            ),
            "/v2/models/{name}/versions/{version}/ready": _get(
                "Model readiness.", [NAME, VERSION], _ref("ModelReady"), READY_ERRORS
            ),
            "/v2/models/{name}/infer": _infer("Inference.", [NAME]),
            "/v2/models/{name}/versions/{version}/infer": _infer("Inference.", [NAME, VERSION]),
            "/v1/models/{name}": _get(
                "KServe v1 model readiness.", [NAME], _ref("ModelReady"), READY_ERRORS
            ),
            "/v1/models/{name}:predict": {
                "post": {
                    "summary": "KServe v1 prediction, for models with one input.",
                    "parameters": [NAME, TIMEOUT],
                    "requestBody": {"required": True, "content": _json(_ref("PredictRequest"))},
                    "responses": {
                        "200": {
                            "description": "One prediction per instance.",
                            "content": _json(_ref("PredictResponse")),
                        },
                        **INFER_ERRORS,
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics.",
                    "responses": {
                        "200": {
                            "description": "Prometheus text format.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document.",
                    "responses": {
                        "200": {"description": "OpenAPI 3.1.", "content": _json({"type": "object"})}
                    },
                }
            },
        },
        "components": {"schemas": SCHEMAS},
    }
