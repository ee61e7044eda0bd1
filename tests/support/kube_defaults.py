"""A few defaults the API server adds to built-in kinds.

Enough that a client comparing its desired object with the stored one must ignore fields it
did not set, and must compare quantities by value ("1000m" is stored as "1").
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def canonical_quantity(text: str) -> str:
    """The API server's canonical form for the simple cases: millis and whole numbers."""
    if text.endswith("m") and text[:-1].isdigit():
        millis = int(text[:-1])
        return str(millis // 1000) if millis % 1000 == 0 else text
    try:
        value = Decimal(text)
    except ArithmeticError:
        return text
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int(value * 1000)}m"


def _container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = str(container.get("image", ""))
    container.setdefault(
        "imagePullPolicy", "Always" if image.endswith(":latest") else "IfNotPresent"
    )
    for port in container.get("ports", []):
        port.setdefault("protocol", "TCP")
    for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if isinstance(probe, dict):
            for key, value in (
                ("timeoutSeconds", 1),
                ("successThreshold", 1),
                ("periodSeconds", 10),
                ("failureThreshold", 3),
            ):
                probe.setdefault(key, value)
            if "httpGet" in probe:
                probe["httpGet"].setdefault("scheme", "HTTP")
    for section in ("requests", "limits"):
        values = container.get("resources", {}).get(section, {})
        for name in list(values):
            values[name] = canonical_quantity(str(values[name]))


def _pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        _container(container)


def apply_builtin_defaults(kind: str, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "Deployment":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy",
            {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
        )
        template = spec.get("template", {})
        template.setdefault("metadata", {}).setdefault("creationTimestamp", None)
        _pod_spec(template.setdefault("spec", {}))
    elif kind == "Service":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("clusterIP", "10.96.0.10")
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports", []):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
