"""The OpenAPI 3.1 description of the sidecar's HTTP API, served at `GET /openapi.json`.

Rendered from the route table (`app.ROUTES`), the operations (`operations.py`) and the body
types (`bodies.py`, JSON Schema by pydantic), so that generic clients and API fuzzers
(schemathesis in `tests/reliability/`) see what the code does. `docs/sidecar.md` is the
prose version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import TypeAdapter

from carpool.engine.errors import RETRY_AFTER, QueueFull, SidecarError
from carpool.engine.throughput import MAX_RETRY_AFTER_S
from carpool_sidecar.bodies import Error
from carpool_sidecar.operations import PATH_PARAMETERS, Operation, Parameter

Schema = dict[str, Any]
REF_TEMPLATE = "#/components/schemas/{model}"
# aiohttp's `{name:regex}` placeholders are OpenAPI's `{name}`.
PLACEHOLDER = re.compile(r"\{(\w+)(?::[^}]*)?\}")
BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
RETRY_AFTER_HEADER = {
    RETRY_AFTER: {
        "description": f"Seconds until the queue has likely drained (1 to {MAX_RETRY_AFTER_S}).",
        "required": True,
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_RETRY_AFTER_S},
    }
}


def document(routes: Iterable[tuple[str, str, Operation]], version: str) -> Schema:
    """The document for `(method, aiohttp path, operation)` routes; `version` goes in `info`."""
    routes = list(routes)
    used = {kind for _, _, op in routes for kind in (op.ok, op.request) if kind is not None}
    kinds = sorted(used | {Error}, key=lambda kind: kind.__name__)
    refs, definitions = TypeAdapter.json_schemas(
        [(kind, "serialization", TypeAdapter(kind)) for kind in kinds], ref_template=REF_TEMPLATE
    )
    schemas = {kind: refs[(kind, "serialization")] for kind in kinds}
    paths: dict[str, Schema] = {}
    for method, path, operation in routes:
        path = PLACEHOLDER.sub(r"{\1}", path)
        names = PLACEHOLDER.findall(path)
        paths.setdefault(path, {})[method.lower()] = _operation(
            operation, [PATH_PARAMETERS[name] for name in names], schemas
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "carpool sidecar",
            "version": version,
            "description": "Dynamic batching in front of a model server: Open Inference "
            "Protocol v2 with the binary tensor data extension, and KServe v1.",
        },
        "paths": paths,
        "components": {"schemas": definitions["$defs"]},
    }


def _operation(
    operation: Operation, in_path: list[Parameter], schemas: dict[Any, Schema]
) -> Schema:
    ok_schema = schemas[operation.ok] if operation.ok else _untyped(operation.media_type)
    ok_content = {operation.media_type: {"schema": ok_schema}}
    if operation.binary:
        ok_content |= BINARY
    responses: Schema = {"200": {"description": "OK", "content": ok_content}}
    if operation.probe:
        responses["503"] = {"description": "Not ready, or not live.", "content": ok_content}
    for error in operation.errors:
        _add_error(responses, error, schemas[Error])
    result: Schema = {
        "summary": operation.summary,
        "parameters": [_parameter(p) for p in [*in_path, *operation.parameters]],
        "responses": dict(sorted(responses.items())),
    }
    if operation.request is not None:
        content = {"application/json": {"schema": schemas[operation.request]}}
        if operation.binary:
            content |= BINARY
        result["requestBody"] = {"required": True, "content": content}
    return result


def _add_error(responses: Schema, error: type[SidecarError], schema: Schema) -> None:
    status = str(error.status)
    if status in responses:
        responses[status]["description"] += " " + error.description
        return
    responses[status] = {
        "description": error.description,
        "content": {"application/json": {"schema": schema}},
    }
    if error is QueueFull:
        responses[status]["headers"] = RETRY_AFTER_HEADER


def _parameter(parameter: Parameter) -> Schema:
    return {
        "name": parameter.name,
        "in": parameter.location,
        "required": parameter.location == "path",
        "schema": parameter.schema,
        "description": parameter.description,
    }


def _untyped(media_type: str) -> Schema:
    return {"type": "object"} if media_type == "application/json" else {"type": "string"}
