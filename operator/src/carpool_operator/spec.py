"""The BatchedModel spec as typed values, with defaults applied.

Structural defaults (replicas, resources, service, ...) are the CRD's: the API server applies
them, and `carpool render -f` reads files that never met one, so the same values live here too
(a test keeps both in step). `spec.batching` and the images have no CRD default: what a spec
leaves out comes from the operator's `Defaults`, which the chart may set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from carpool.contract.batching import KNOB_BY_KEY, Batching
from carpool.contract.handlers import BUILTIN_HANDLERS
from carpool.contract.pod import GRPC_PORT, MODEL_MAX_BATCH_SIZE
from carpool_operator.defaults import Defaults, is_image
from carpool_operator.gpu import model_image, runtime_class_name
from carpool_operator.probes import DEFAULT_LOAD_TIMEOUT_S
from carpool_operator.rollout import Rollout, parse_rollout
from carpool_operator.termination import DEFAULT_DRAIN_DELAY_S
from carpool_operator.threads import torch_threads
from carpool_operator.types import Manifest

_HANDLER_CLASS = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)


class SpecError(ValueError):
    """A spec the schema accepts but that cannot be realised; `reason` is one CamelCase word."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Weights:
    kind: str  # "image", "pvc", "uri" or "storage"
    claim_name: str = ""
    mount_path: str = "/models"
    read_only: bool = True
    url: str = ""
    file_name: str = "model.pt"
    fetcher_image: str = "curlimages/curl:8.11.1"
    secret_name: str = ""  # storage: the Secret holding the store's credentials


@dataclass(frozen=True)
class Autoscaling:
    enabled: bool = False  # carpool's HPA sets the replica count
    external: bool = False  # another controller does (a KEDA ScaledObject, the user's own HPA)
    min_replicas: int = 1
    max_replicas: int = 4
    target_queue_items_per_pod: int = 16
    target_queue_drain_ms: int = 0  # also on carpool_queue_drain_seconds; 0: items alone


@dataclass(frozen=True)
class ModelSpec:
    """One BatchedModel's spec, defaults filled in and images resolved."""

    name: str
    namespace: str
    uid: str
    generation: int
    handler: str
    image: str
    model_name: str = ""
    model_path: str = ""
    args: tuple[str, ...] = ()
    env: tuple[Manifest, ...] = ()
    device: str = "auto"
    dtype: str = "fp32"
    # The model's hard limit: the model server's --max-batch-size, what it accepts and warms up.
    model_max_batch_size: int = MODEL_MAX_BATCH_SIZE
    weights: Weights = field(default_factory=lambda: Weights(kind="image"))
    replicas: int = 1
    gpu: int = 0
    cpu: str = "1"
    memory: str = "2Gi"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Manifest, ...] = ()
    affinity: Manifest = field(default_factory=dict)
    priority_class_name: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    service_account_name: str = ""
    batching: Batching = field(default_factory=Batching)
    sidecar_image: str = ""
    sidecar_cpu: str = "500m"
    sidecar_memory: str = "256Mi"
    sidecar_front_processes: int = 1
    service_type: str = "ClusterIP"
    service_port: int = 80
    # The sidecar's gRPC front, and its port on the Service (the container's is GRPC_PORT).
    grpc_enabled: bool = True
    grpc_service_port: int = GRPC_PORT
    pod_monitor: bool = False
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    runtime_class_name: str = ""
    rollout: Rollout = field(default_factory=Rollout)
    load_timeout_s: int = DEFAULT_LOAD_TIMEOUT_S
    drain_delay_s: int = DEFAULT_DRAIN_DELAY_S
    torch_threads: int = 1
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def autoscaled(self) -> bool:
        """An autoscaler, carpool's HPA or another, sets the replica count: not spec.replicas."""
        return self.autoscaling.enabled or self.autoscaling.external

    @property
    def fewest_replicas(self) -> int:
        """The fewest pods the model is meant to run, what Ready waits for: spec.replicas, the
        HPA's minimum, or one under an external scaler (whose bounds carpool does not know)."""
        if self.autoscaling.enabled:
            return self.autoscaling.min_replicas
        return 1 if self.autoscaling.external else self.replicas

    @property
    def batch_size_clamped(self) -> bool:
        """spec.batching asks for larger batches than the model server takes."""
        return self.batching.max_batch_size > self.model_max_batch_size

    @property
    def sidecar_batching(self) -> Batching:
        """The settings the sidecars run with: spec.batching, its batch size held to the model's."""
        size = min(self.batching.max_batch_size, self.model_max_batch_size)
        return replace(self.batching, max_batch_size=size)


def _section(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def _weights(model: Mapping[str, Any]) -> Weights:
    weights = _section(model, "weights")
    if "pvc" in weights:
        pvc = _section(weights, "pvc")
        return Weights(
            kind="pvc",
            claim_name=str(pvc.get("claimName", "")),
            mount_path=str(pvc.get("mountPath", Weights.mount_path)),
            read_only=bool(pvc.get("readOnly", Weights.read_only)),
        )
    if "storageUri" in weights:
        return Weights(
            kind="storage",
            url=str(weights["storageUri"]),
            mount_path=str(weights.get("mountPath", Weights.mount_path)),
            secret_name=str(weights.get("secretName", "")),
        )
    if "uri" in weights:
        uri = _section(weights, "uri")
        return Weights(
            kind="uri",
            url=str(uri.get("url", "")),
            mount_path=str(uri.get("mountPath", Weights.mount_path)),
            file_name=str(uri.get("fileName", Weights.file_name)),
            fetcher_image=str(uri.get("fetcherImage", Weights.fetcher_image)),
        )
    return Weights(kind="image")


def _known(batching: Mapping[str, Any]) -> dict[str, Any]:
    """spec.batching without keys that are no knob's: the API server prunes those, and a file
    given to `carpool render` gets the same."""
    return {key: value for key, value in batching.items() if key in KNOB_BY_KEY}


def _optional_int(section: Mapping[str, Any], key: str) -> int | None:
    value = section.get(key)
    return None if value is None else int(value)


def _check_handler(handler: str) -> None:
    if handler not in BUILTIN_HANDLERS and not _HANDLER_CLASS.match(handler):
        raise SpecError(
            "InvalidHandler",
            f"spec.model.handler {handler!r} is neither a built-in "
            f"({', '.join(BUILTIN_HANDLERS)}) nor module:Class",
        )


def _check_image(key: str, image: str) -> None:
    if not is_image(image):
        raise SpecError("InvalidImage", f"{key} {image!r} is not a valid image reference")


def parse(body: Mapping[str, Any], *, defaults: Defaults) -> ModelSpec:
    """Read a BatchedModel object; raise SpecError for what the schema cannot catch."""
    metadata = _section(body, "metadata")
    spec = _section(body, "spec")
    model = _section(spec, "model")
    resources = _section(spec, "resources")
    batching = _section(spec, "batching")
    sidecar = _section(spec, "sidecar")
    sidecar_resources = _section(sidecar, "resources")
    service = _section(spec, "service")
    grpc = _section(spec, "grpc")
    autoscaling = _section(spec, "autoscaling")

    handler = str(model.get("handler", ""))
    _check_handler(handler)
    gpu = int(resources.get("gpu", 0))
    image = model_image(str(model.get("image", "")), defaults, gpu)
    _check_image("spec.model.image", image)
    sidecar_image = str(sidecar.get("image") or defaults.sidecar_image or image)
    _check_image("spec.sidecar.image", sidecar_image)
    weights = _weights(model)
    if weights.kind == "uri":
        _check_image("spec.model.weights.uri.fetcherImage", weights.fetcher_image)

    return ModelSpec(
        name=str(metadata.get("name", "")),
        namespace=str(metadata.get("namespace") or "default"),
        uid=str(metadata.get("uid", "")),
        generation=int(metadata.get("generation", 0)),
        handler=handler,
        image=image,
        model_name=str(model.get("modelName", "")),
        model_path=str(model.get("modelPath", "")),
        args=tuple(str(arg) for arg in model.get("args", [])),
        env=tuple(dict(item) for item in model.get("env", [])),
        device=str(model.get("device", "auto")),
        dtype=str(model.get("dtype", "fp32")),
        model_max_batch_size=int(model.get("maxBatchSize", MODEL_MAX_BATCH_SIZE)),
        weights=weights,
        replicas=int(spec.get("replicas", 1)),
        gpu=gpu,
        cpu=str(resources.get("cpu", "1")),
        memory=str(resources.get("memory", "2Gi")),
        node_selector={str(k): str(v) for k, v in _section(spec, "nodeSelector").items()},
        tolerations=tuple(dict(item) for item in spec.get("tolerations", [])),
        affinity=dict(_section(spec, "affinity")),
        priority_class_name=str(spec.get("priorityClassName", "")),
        image_pull_secrets=tuple(str(s["name"]) for s in spec.get("imagePullSecrets", [])),
        service_account_name=str(spec.get("serviceAccountName", "")),
        batching=defaults.batching.overlay(_known(batching)),
        sidecar_image=sidecar_image,
        sidecar_cpu=str(sidecar_resources.get("cpu", "500m")),
        sidecar_memory=str(sidecar_resources.get("memory", "256Mi")),
        sidecar_front_processes=int(sidecar.get("frontProcesses", 1)),
        service_type=str(service.get("type", "ClusterIP")),
        service_port=int(service.get("port", 80)),
        grpc_enabled=bool(grpc.get("enabled", True)),
        grpc_service_port=int(grpc.get("port", GRPC_PORT)),
        pod_monitor=bool(_section(spec, "monitoring").get("podMonitor", False)),
        autoscaling=Autoscaling(
            enabled=bool(autoscaling.get("enabled", False)),
            external=bool(autoscaling.get("external", False)),
            min_replicas=int(autoscaling.get("minReplicas", 1)),
            max_replicas=int(autoscaling.get("maxReplicas", 4)),
            target_queue_items_per_pod=int(autoscaling.get("targetQueueItemsPerPod", 16)),
            target_queue_drain_ms=int(autoscaling.get("targetQueueDrainMs", 0)),
        ),
        runtime_class_name=runtime_class_name(str(spec.get("runtimeClassName", "")), defaults, gpu),
        rollout=parse_rollout(_section(spec, "rollout"), gpu),
        load_timeout_s=int(model.get("loadTimeoutSeconds", DEFAULT_LOAD_TIMEOUT_S)),
        drain_delay_s=int(
            _section(spec, "shutdown").get("drainDelaySeconds", DEFAULT_DRAIN_DELAY_S)
        ),
        torch_threads=torch_threads(
            str(resources.get("cpu", "1")), _optional_int(model, "torchThreads")
        ),
        pod_monitor_labels={
            str(k): str(v) for k, v in _section(_section(spec, "monitoring"), "labels").items()
        },
    )
