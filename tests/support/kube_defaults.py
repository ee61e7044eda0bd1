"""A few defaults the API server adds to built-in kinds.

Enough that a client comparing its desired object with the stored one must ignore fields it
did not set, and must compare quantities as the API server stores them ("1000m" is stored as
"1", "0.0001" as "100u"; the form comes from carpool_operator.quantity, whose test holds it
to apimachinery's own cases).
"""

from __future__ import annotations

from typing import Any

from carpool_operator.quantity import canonical


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
        _canonical(values, list(values))


def _canonical(node: dict[str, Any], keys: list[str]) -> None:
    """The quantities at `keys` of `node` in the form the API server stores them."""
    for key in keys:
        if key in node:
            node[key] = canonical(str(node[key])) or node[key]


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
    elif kind == "HorizontalPodAutoscaler":
        for metric in spec.get("metrics", []):
            for source in metric.values():
                if isinstance(source, dict) and isinstance(source.get("target"), dict):
                    _canonical(source["target"], ["value", "averageValue"])
