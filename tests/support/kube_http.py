"""Plain HTTP calls to the test API server, as a client without kubectl would make them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from support.kube_api import ServedKubeApi


def call(
    served: ServedKubeApi,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    token: str = "",
) -> tuple[int, Any]:
    """The status and JSON answer of one request (an error status is an answer too)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(served.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def watch(served: ServedKubeApi, path: str) -> list[dict[str, Any]]:
    """The events of a watch the server ends by itself (give `timeoutSeconds`, or a version
    it no longer keeps)."""
    with urllib.request.urlopen(served.url + path, timeout=10) as response:
        lines = response.read().decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()]
