"""Pure rendering: a BatchedModel in, the manifests of its children out.

The operator applies this output and `carpool render` prints it, so both always agree. Nothing
here talks to a server: whether the PodMonitor API exists is an argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from carpool.contract.handlers import FILE_HANDLERS, FOLDER_HANDLERS
from carpool.contract.pod import (
    CONFIG_DIR,
    CONFIG_FILE,
    DRAIN_SECONDS,
    GRPC_PORT,
    METRICS_PATH,
    METRICS_PORT,
    MODEL_SERVER_COMMAND,
    MODEL_SERVER_LIVE_PATH,
    MODEL_SERVER_READY_PATH,
    MODEL_SERVER_URL,
    QUEUE_DRAIN_METRIC,
    QUEUE_ITEMS_METRIC,
    SIDECAR_COMMAND,
    SIDECAR_LIVE_PATH,
    SIDECAR_PORT,
    SIDECAR_READY_PATH,
    SOCKET_DIR,
    SOCKET_PATH,
    ModelServerFlag,
    SidecarFlag,
)

# DEFAULT_IMAGE: re-exported, the image a model gets when neither it nor the operator names one.
from carpool_operator.defaults import DEFAULT_IMAGE as DEFAULT_IMAGE
from carpool_operator.defaults import Defaults
from carpool_operator.names import API_VERSION, KIND
from carpool_operator.probes import startup_probe
from carpool_operator.rollout import strategy
from carpool_operator.spec import ModelSpec, parse
from carpool_operator.termination import grace_period, pre_stop
from carpool_operator.types import Manifest
from carpool_operator.weights import storage_fetcher, storage_volumes

MANAGED_BY = "carpool"

# After SIGTERM the sidecar sends what it queued for up to DRAIN_SECONDS; the model server
# serves while those batches come (at most as long), then finishes the batch in flight. The
# kubelet waits the grace period before SIGKILL: the drain delay (termination.py), the drain,
# and a margin for the last batch and exit.
SHUTDOWN_MARGIN_S = 15
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
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": spec.name,
                "uid": spec.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return metadata


def _model_path(spec: ModelSpec) -> str:
    """spec.model.modelPath, or what the weights give a built-in handler that reads a model:
    the file weights.uri fetches, or the folder storageUri or a PVC is mounted at."""
    if spec.model_path:
        return spec.model_path
    weights = spec.weights
    if weights.kind == "uri" and spec.handler in FILE_HANDLERS:
        return f"{weights.mount_path}/{weights.file_name}"
    if weights.kind in ("storage", "pvc") and spec.handler in FOLDER_HANDLERS:
        return weights.mount_path
    return ""


def _model_server(spec: ModelSpec) -> Manifest:
    command = [
        *MODEL_SERVER_COMMAND,
        ModelServerFlag.HANDLER, spec.handler,
        ModelServerFlag.MODEL_NAME, model_name(spec),
        ModelServerFlag.SOCKET, SOCKET_PATH,
        ModelServerFlag.METRICS_PORT, str(METRICS_PORT),
        ModelServerFlag.METRICS_HOST, "0.0.0.0",
        ModelServerFlag.DEVICE, spec.device,
        ModelServerFlag.DTYPE, spec.dtype,
        # The model's limit, not spec.batching's: warm-up depends on it, so a change rolls the
        # pods, while the sidecar's batch size is re-tuned live through the ConfigMap.
        ModelServerFlag.MAX_BATCH_SIZE, str(spec.model_max_batch_size),
        ModelServerFlag.DRAIN_SECONDS, str(DRAIN_SECONDS),
        ModelServerFlag.TORCH_THREADS, str(spec.torch_threads),
    ]  # fmt: skip
    if spec.gpu:
        command.append(ModelServerFlag.REQUIRE_GPU)
    if model_path := _model_path(spec):
        command += [ModelServerFlag.MODEL_PATH, model_path]
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
            "httpGet": {"path": MODEL_SERVER_READY_PATH, "port": "metrics"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": MODEL_SERVER_LIVE_PATH, "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # Loading and warming a model can take minutes; liveness waits for this first.
        "startupProbe": startup_probe(spec.load_timeout_s, "metrics"),
        "resources": {"requests": {"cpu": spec.cpu, "memory": spec.memory}, "limits": limits},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": mounts,
        # A start that fails (no GPU, a bad model) says why in `kubectl describe pod`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if lifecycle := pre_stop(spec.drain_delay_s):
        container["lifecycle"] = lifecycle
    if spec.env:
        container["env"] = [dict(item) for item in spec.env]
    return container


def _sidecar(spec: ModelSpec) -> Manifest:
    sidecar_resources = {"cpu": spec.sidecar_cpu, "memory": spec.sidecar_memory}
    command = [
        *SIDECAR_COMMAND,
        SidecarFlag.MODEL_NAME, model_name(spec),
        SidecarFlag.MODEL_SERVER, MODEL_SERVER_URL,
        SidecarFlag.HOST, "0.0.0.0",
        SidecarFlag.PORT, str(SIDECAR_PORT),
        # Always said: the sidecar's own default is on, so off must be an explicit 0.
        SidecarFlag.GRPC_PORT, str(GRPC_PORT if spec.grpc_enabled else 0),
        SidecarFlag.DRAIN_SECONDS, str(DRAIN_SECONDS),
        SidecarFlag.DRAIN_DELAY_SECONDS, str(spec.drain_delay_s),
        SidecarFlag.CONFIG_FILE, f"{CONFIG_DIR}/{CONFIG_FILE}",
    ]  # fmt: skip
    if spec.sidecar_front_processes > 1:
        # Only then: pods of models that leave it unset keep their command as it was.
        command += [SidecarFlag.FRONT_PROCESSES, str(spec.sidecar_front_processes)]
    ports: list[Manifest] = [{"name": "http", "containerPort": SIDECAR_PORT, "protocol": "TCP"}]
    if spec.grpc_enabled:
        ports.append({"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"})
    return {
        "name": "sidecar",
        "image": spec.sidecar_image,
        "command": command,
        "ports": ports,
        "readinessProbe": {
            "httpGet": {"path": SIDECAR_READY_PATH, "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": SIDECAR_LIVE_PATH, "port": "http"},
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
    if spec.weights.kind == "storage":
        resources = {"cpu": spec.cpu, "memory": spec.memory}
        container = storage_fetcher(
            image=spec.image,
            uri=spec.weights.url,
            mount_path=spec.weights.mount_path,
            secret_name=spec.weights.secret_name,
            resources={"requests": resources, "limits": dict(resources)},
        )
        return {**container, "securityContext": _CONTAINER_SECURITY}
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
    elif spec.weights.kind in ("uri", "storage"):
        volumes.append({"name": "weights", "emptyDir": {}})
        volumes += storage_volumes(spec.weights.secret_name)
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
        "terminationGracePeriodSeconds": grace_period(
            spec.drain_delay_s, DRAIN_SECONDS, SHUTDOWN_MARGIN_S
        ),
        "containers": [_model_server(spec), _sidecar(spec)],
        "volumes": _volumes(spec),
    }
    # Optional fields appear only when set: the API server drops empty ones, and a field we
    # render but the server drops would look like drift on every resync.
    if spec.weights.kind in ("uri", "storage"):
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
    if spec.runtime_class_name:
        pod["runtimeClassName"] = spec.runtime_class_name
    return pod


def deployment(spec: ModelSpec) -> Manifest:
    deployment_spec: Manifest = {
        "selector": {"matchLabels": selector_labels(spec)},
        # Deliberately no hash of the batching settings here: the sidecar re-reads them live.
        "template": {"metadata": {"labels": labels(spec)}, "spec": _pod_spec(spec)},
    }
    if not spec.autoscaled:  # otherwise the autoscaler owns the count (see handover.py)
        deployment_spec["replicas"] = spec.replicas
    if rollout := strategy(spec.rollout):
        deployment_spec["strategy"] = rollout
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
        "data": {CONFIG_FILE: content},
    }


def _service_port(name: str, port: int) -> Manifest:
    # appProtocol tells meshes and gateways what to speak to the pods (HTTP/2 for gRPC).
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP", "appProtocol": name}


def service(spec: ModelSpec) -> Manifest:
    ports = [_service_port("http", spec.service_port)]
    if spec.grpc_enabled:
        ports.append(_service_port("grpc", spec.grpc_service_port))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.name),
        "spec": {"type": spec.service_type, "selector": selector_labels(spec), "ports": ports},
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
    # Per pod, averaged over the pods; with two, the HPA follows whichever asks for more.
    targets = [(QUEUE_ITEMS_METRIC, str(scaling.target_queue_items_per_pod))]
    if scaling.target_queue_drain_ms:
        # A quantity of seconds, in thousandths.
        targets.append((QUEUE_DRAIN_METRIC, f"{scaling.target_queue_drain_ms}m"))
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
                        "metric": {"name": name},
                        "target": {"type": "AverageValue", "averageValue": value},
                    },
                }
                for name, value in targets
            ],
        },
    }


def pod_monitor(spec: ModelSpec) -> Manifest:
    metadata = _metadata(spec, spec.name)
    # Extra labels first: a Prometheus selects PodMonitors by them (e.g. `release`), but
    # they must not displace carpool's own.
    metadata["labels"] = {**spec.pod_monitor_labels, **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": selector_labels(spec)},
            "podMetricsEndpoints": [
                {"port": "http", "path": METRICS_PATH},
                {"port": "metrics", "path": METRICS_PATH},
            ],
        },
    }


def wants_disruption_budget(spec: ModelSpec) -> bool:
    # An external scaler may add pods at any time, and `maxUnavailable: 1` never blocks the
    # eviction of a lone pod: the budget is there whatever it scales to.
    return spec.autoscaling.external or spec.fewest_replicas > 1


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
