"""Type aliases shared by the operator's modules."""

from __future__ import annotations

from typing import Any, TypeAlias

# A Kubernetes object or a part of one, as JSON-like data.
Manifest: TypeAlias = dict[str, Any]
