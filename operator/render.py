"""Pure rendering: a BatchedModel in, the manifests of its children out.

The operator applies this output and `carpool render` prints it, so both always agree. Nothing
here talks to a server: whether the PodMonitor API exists is an argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# DEFAULT_IMAGE: re-exported, the image a model gets when neither it nor the operator names one.
from carpool.operator.defaults import DEFAULT_IMAGE as DEFAULT_IMAGE
from carpool.operator.defaults import Defaults
from carpool.operator.spec import ModelSpec, parse
from carpool.operator.types import Manifest

GROUP = "carpool.dev"
VERSION = "v1alpha1"
KIND = "BatchedModel"
MANAGED_BY = "carpool"

SOCKET_DIR = "/run/carpool"
SOCKET_PATH = f"{SOCKET_DIR}/model.sock"
CONFIG_DIR = "/etc/carpool"
CONFIG_KEY = "batching.json"
# After SIGTERM the sidecar sends what it queued for up to DRAIN_S; the model server serves
# while those batches come (at most as long), then finishes the batch in flight. The kubelet
# waits the grace period before SIGKILL: the drain plus a margin for the last batch and exit.
DRAIN_S = 30
SHUTDOWN_MARGIN_S = 15
TERMINATION_GRACE_S = DRAIN_S + SHUTDOWN_MARGIN_S
SIDECAR_PORT = 8080
METRICS_PORT = 9091
RUN_AS = 65532

# The restricted Pod Security Standard, per container.
_CONTAINER_SECURITY: Manifest = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def selector_for(name: str) -> dict[str, str]:
    """The labels that select the pods of the BatchedModel `name`."""
    return {"app.kubernetes.io/name": "batchedmodel", "app.kubernetes.io/instance": name}


def selector_labels(spec: ModelSpec) -> dict[str, str]:
    return selector_for(spec.name)


def labels(spec: ModelSpec) -> dict[str, str]:
    return {
        **selector_labels(spec),
        "app.kubernetes.io/component": "model",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def config_map_name(spec: ModelSpec) -> str:
    return f"{spec.name}-batching"


def service_url(spec: ModelSpec) -> str:
    host = f"{spec.name}.{spec.namespace}.svc.cluster.local"
    return f"http://{host}" if spec.service_port == 80 else f"http://{host}:{spec.service_port}"


def model_name(spec: ModelSpec) -> str:
    """The v2 protocol's model name: /v2/models/<this>/infer."""
    return spec.model_name or spec.name


def _metadata(spec: ModelSpec, name: str) -> Manifest:
    metadata: Manifest = {"name": name, "namespace": spec.namespace, "labels": labels(spec)}
    if spec.uid:  # absent when rendering a file that never met an API server
        metadata["ownerReferences"] = [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": spec.name,
                "uid": spec.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return metadata


def _model_server(spec: ModelSpec) -> Manifest:
    command = [
        "carpool", "model-server",
        "--handler", spec.handler,
        "--model-name", model_name(spec),
        "--socket", SOCKET_PATH,
        "--metrics-port", str(METRICS_PORT),
        "--metrics-host", "0.0.0.0",
        "--device", spec.device,
        "--dtype", spec.dtype,
        # The model's limit, not spec.batching's: warm-up depends on it, so a change rolls the
        # pods, while the sidecar's batch size is re-tuned live through the ConfigMap.
        "--max-batch-size", str(spec.model_max_batch_size),
        "--drain-seconds", str(DRAIN_S),
    ]  # fmt: skip
    if spec.model_path:
        command += ["--model-path", spec.model_path]
    command += list(spec.args)

    mounts: list[Manifest] = [
        {"name": "socket", "mountPath": SOCKET_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if spec.weights.kind != "image":
        mount: Manifest = {"name": "weights", "mountPath": spec.weights.mount_path}
        if spec.weights.kind == "pvc" and spec.weights.read_only:
            mount["readOnly"] = True
        mounts.append(mount)

    limits: Manifest = {"cpu": spec.cpu, "memory": spec.memory}
    if spec.gpu:
        limits["nvidia.com/gpu"] = str(spec.gpu)
    container: Manifest = {
        "name": "model-server",
        "image": spec.image,
        "command": command,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "metrics"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # Loading and warming a model can take minutes; liveness waits for this first.
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 5,
            "failureThreshold": 120,
        },
        "resources": {"requests": {"cpu": spec.cpu, "memory": spec.memory}, "limits": limits},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": mounts,
    }
    if spec.env:
        container["env"] = [dict(item) for item in spec.env]
    return container


def _sidecar(spec: ModelSpec) -> Manifest:
    sidecar_resources = {"cpu": spec.sidecar_cpu, "memory": spec.sidecar_memory}
    return {
        "name": "sidecar",
        "image": spec.sidecar_image,
        "command": [
            "carpool",
            "sidecar",
            "--model-name",
            model_name(spec),
            "--model-server",
            f"unix://{SOCKET_PATH}",
            "--host",
            "0.0.0.0",
            "--port",
            str(SIDECAR_PORT),
            "--drain-seconds",
            str(DRAIN_S),
            "--config-file",
            f"{CONFIG_DIR}/{CONFIG_KEY}",
        ],
        "ports": [{"name": "http", "containerPort": SIDECAR_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": {"requests": sidecar_resources, "limits": dict(sidecar_resources)},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "socket", "mountPath": SOCKET_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            # The whole folder, not a subPath: the kubelet then swaps in ConfigMap updates.
            {"name": "batching", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
    }


def _fetcher(spec: ModelSpec) -> Manifest:
    target = f"{spec.weights.mount_path}/{spec.weights.file_name}"
    return {
        "name": "fetch-weights",
        "image": spec.weights.fetcher_image,
        "command": ["curl", "-fsSL", "--retry", "5", "-o", target, spec.weights.url],
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "weights", "mountPath": spec.weights.mount_path},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _volumes(spec: ModelSpec) -> list[Manifest]:
    volumes: list[Manifest] = [
        {"name": "socket", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "batching", "configMap": {"name": config_map_name(spec)}},
    ]
    if spec.weights.kind == "pvc":
        claim: Manifest = {"claimName": spec.weights.claim_name}
        if spec.weights.read_only:
            claim["readOnly"] = True
        volumes.append({"name": "weights", "persistentVolumeClaim": claim})
    elif spec.weights.kind == "uri":
        volumes.append({"name": "weights", "emptyDir": {}})
    return volumes


def _pod_spec(spec: ModelSpec) -> Manifest:
    pod: Manifest = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The pods serve a model; they never talk to the Kubernetes API.
        "automountServiceAccountToken": False,
        # Rendered although false is the default: carpool then owns them, so a hand edit that
        # turns one on is put back (server-side apply leaves fields no one applied alone).
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "containers": [_model_server(spec), _sidecar(spec)],
        "volumes": _volumes(spec),
    }
    # Optional fields appear only when set: the API server drops empty ones, and a field we
    # render but the server drops would look like drift on every resync.
    if spec.weights.kind == "uri":
        pod["initContainers"] = [_fetcher(spec)]
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(item) for item in spec.tolerations]
    if spec.affinity:
        pod["affinity"] = dict(spec.affinity)
    if spec.priority_class_name:
        pod["priorityClassName"] = spec.priority_class_name
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    return pod


def deployment(spec: ModelSpec) -> Manifest:
    deployment_spec: Manifest = {
        "selector": {"matchLabels": selector_labels(spec)},
        # Deliberately no hash of the batching settings here: the sidecar re-reads them live.
        "template": {"metadata": {"labels": labels(spec)}, "spec": _pod_spec(spec)},
    }
    if not spec.autoscaling.enabled:  # otherwise the HPA owns the replica count
        deployment_spec["replicas"] = spec.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, spec.name),
        "spec": deployment_spec,
    }


def config_map(spec: ModelSpec) -> Manifest:
    content = json.dumps(spec.sidecar_batching.as_file(), indent=2, sort_keys=True) + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, config_map_name(spec)),
        "data": {CONFIG_KEY: content},
    }


def service(spec: ModelSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.name),
        "spec": {
            "type": spec.service_type,
            "selector": selector_labels(spec),
            "ports": [
                {"name": "http", "port": spec.service_port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def pod_disruption_budget(spec: ModelSpec) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, spec.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(spec)}},
    }


def horizontal_pod_autoscaler(spec: ModelSpec) -> Manifest:
    scaling = spec.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(spec, spec.name),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "carpool_queue_items"},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(scaling.target_queue_items_per_pod),
                        },
                    },
                }
            ],
        },
    }


def pod_monitor(spec: ModelSpec) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(spec, spec.name),
        "spec": {
            "selector": {"matchLabels": selector_labels(spec)},
            "podMetricsEndpoints": [
                {"port": "http", "path": "/metrics"},
                {"port": "metrics", "path": "/metrics"},
            ],
        },
    }


def wants_disruption_budget(spec: ModelSpec) -> bool:
    fewest = spec.autoscaling.min_replicas if spec.autoscaling.enabled else spec.replicas
    return fewest > 1


def render_spec(spec: ModelSpec, *, podmonitor_api: bool) -> list[Manifest]:
    manifests = [config_map(spec), deployment(spec), service(spec)]
    if wants_disruption_budget(spec):
        manifests.append(pod_disruption_budget(spec))
    if spec.autoscaling.enabled:
        manifests.append(horizontal_pod_autoscaler(spec))
    if spec.pod_monitor and podmonitor_api:
        manifests.append(pod_monitor(spec))
    return manifests


def render(
    body: Mapping[str, Any], *, defaults: Defaults | None = None, podmonitor_api: bool = False
) -> list[Manifest]:
    """The children of one BatchedModel; raises SpecError for a spec that cannot be realised.

    `defaults` fill what the spec leaves out (the operator's, e.g. set by the chart); None
    means the built-in ones.
    """
    spec = parse(body, defaults=defaults or Defaults())
    return render_spec(spec, podmonitor_api=podmonitor_api)
