"""Why a model's pods do not run, read off their status as the kubelet and scheduler report it.

Pure: the reconciler lists the pods, this names the first problem worth a Degraded condition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from carpool.contract.pod import LOAD_FAILED

# Waiting reasons of a container that cannot get its image.
_PULL_FAILURES = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName"}
# The kubelet's words for a Secret that an env entry (or envFrom) reads and that is missing.
_MISSING_SECRET = re.compile(r'\bsecrets? "[^"]+" not found')
# Most specific first: a model that fails to load also crash-loops.
_PRIORITY = (
    "ModelLoadFailed",
    "ImagePullBackOff",
    "SecretNotFound",
    "CreateContainerConfigError",
    "CrashLoopBackOff",
    "Unschedulable",
)


def _container_problems(pod: str, status: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    container = status.get("name", "?")
    state = status.get("state") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    terminated = state.get("terminated") or last
    message = str(terminated.get("message") or "")
    if message.startswith(LOAD_FAILED):
        yield "ModelLoadFailed", f"pod {pod}, {container}: {message.strip()}"
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    detail = str(waiting.get("message") or "")
    if reason in _PULL_FAILURES:
        yield "ImagePullBackOff", f"pod {pod}, {container}: {detail or reason}"
    elif reason == "CreateContainerConfigError":
        # The operator reads no Secret (its RBAC grants none): the kubelet says which is missing.
        why = "SecretNotFound" if _MISSING_SECRET.search(detail) else reason
        yield why, f"pod {pod}, {container}: {detail}"
    elif reason == "CrashLoopBackOff":
        why = f"exit code {last.get('exitCode')}" if last else detail
        yield "CrashLoopBackOff", f"pod {pod}, {container} keeps exiting ({why})"


def _pod_problems(pod: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    name = str(pod.get("metadata", {}).get("name", "?"))
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            yield "Unschedulable", f"pod {name}: {condition.get('message', 'no node fits')}"
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            yield from _container_problems(name, container)


def pod_problem(pods: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the most telling problem among the pods, or None."""
    found = {reason: message for pod in pods for reason, message in _pod_problems(pod)}
    return next(((r, found[r]) for r in _PRIORITY if r in found), None)
