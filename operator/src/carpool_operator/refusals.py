"""Children the API server refused for good, remembered so that a resync does not resend them.

A refusal no retry can fix (kube.ApiError.transient is False) answers the manifest sent, against
the child as it then was (none, for a create): the same manifest against the same child gets the
same answer. So each is kept, by the digest carpool annotates on the manifest
(diff.APPLIED_ANNOTATION) and the child's uid and resourceVersion, with the API server's
message, and the reconcile reports it from here while it renders the same manifest and finds the
same child. A changed spec (or operator default) renders another; a child deleted or edited (as
one does to have a refused update made anew) is another; after RECHECK_S the same one is sent
again, in case what refused it changed (an admission policy, the cluster's version).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from carpool_operator.diff import APPLIED_ANNOTATION
from carpool_operator.types import Manifest

RECHECK_S = 600.0


@dataclass(frozen=True)
class _Refusal:
    digest: str
    child: tuple[str, str] | None  # the uid and resourceVersion it was sent against
    message: str
    since: float


# A model (namespace, name) and one of its children (kind, name).
_Key = tuple[str, str, str, str]


def _key(model: str, manifest: Manifest) -> _Key:
    metadata = manifest["metadata"]
    return (metadata["namespace"], model, manifest["kind"], metadata["name"])


def _digest(manifest: Manifest) -> str:
    return str(manifest["metadata"]["annotations"][APPLIED_ANNOTATION])


def _version(child: Mapping[str, Any] | None) -> tuple[str, str] | None:
    if child is None:
        return None
    metadata = child.get("metadata") or {}
    return str(metadata.get("uid", "")), str(metadata.get("resourceVersion", ""))


@dataclass
class Refusals:
    """The standing refusal of each child, by its model."""

    _refused: dict[_Key, _Refusal] = field(default_factory=dict)

    def of(self, model: str, manifest: Manifest, child: Mapping[str, Any] | None) -> str | None:
        """The API server's message if it refused this very manifest of `model` lately, sent
        against `child` as it is now (None: there is none)."""
        refusal = self._refused.get(_key(model, manifest))
        if refusal is None or refusal.digest != _digest(manifest):
            return None
        if refusal.child != _version(child):
            return None
        if time.monotonic() - refusal.since > RECHECK_S:
            return None
        return refusal.message

    def refused(
        self, model: str, manifest: Manifest, child: Mapping[str, Any] | None, message: str
    ) -> None:
        refusal = _Refusal(_digest(manifest), _version(child), message, time.monotonic())
        self._refused[_key(model, manifest)] = refusal

    def accepted(self, model: str, manifest: Manifest) -> None:
        self._refused.pop(_key(model, manifest), None)

    def forget(self, namespace: str, model: str) -> None:
        """Drop the refusals of a model that is gone."""
        for key in [key for key in self._refused if key[:2] == (namespace, model)]:
            del self._refused[key]
