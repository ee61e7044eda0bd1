"""The pod the operator renders: what its two containers are told and how they meet.

The operator renders these into container args, mounts and ports; the model server and the
sidecar use the same values as their defaults, so a pod and a local run behave alike.
"""

from __future__ import annotations

from typing import Final

# The model server's data listener, a Unix socket in an emptyDir both containers mount.
SOCKET_DIR: Final = "/run/carpool"
SOCKET_PATH: Final = f"{SOCKET_DIR}/model.sock"
MODEL_SERVER_URL: Final = f"unix://{SOCKET_PATH}"
# The sidecar's batching settings: a ConfigMap mounted as a folder, re-read live.
CONFIG_DIR: Final = "/etc/carpool"
CONFIG_FILE: Final = "batching.json"
SIDECAR_PORT: Final = 8080
# The sidecar's gRPC front (Open Inference Protocol); 0 turns it off.
GRPC_PORT: Final = 8081
# The model server's probe listener: health, readiness, metadata and metrics.
METRICS_PORT: Final = 9091
# What the pod's probes and its PodMonitor ask of the two containers. The model server is
# live once it listens and ready once its model is loaded and warm; the sidecar's are the
# Open Inference Protocol's health endpoints.
MODEL_SERVER_LIVE_PATH: Final = "/healthz"
MODEL_SERVER_READY_PATH: Final = "/readyz"
SIDECAR_LIVE_PATH: Final = "/v2/health/live"
SIDECAR_READY_PATH: Final = "/v2/health/ready"
METRICS_PATH: Final = "/metrics"
# The largest batch the model server accepts and warms up unless told otherwise.
MODEL_MAX_BATCH_SIZE: Final = 64
# After SIGTERM the sidecar sends what it queued for up to this long, and the model server
# serves while those batches come (at most as long).
DRAIN_SECONDS: Final = 30
# After SIGTERM the sidecar is not ready but keeps serving this long, so that endpoints and
# load balancers stop sending before it stops listening; then it drains (DRAIN_SECONDS), so
# the pod's grace period must cover both.
DRAIN_DELAY_SECONDS: Final = 5
# The sidecar's gauges that its pods' HorizontalPodAutoscaler scales on, averaged per pod
# (the chart's custom-metrics adapter rules serve them).
QUEUE_ITEMS_METRIC: Final = "carpool_queue_items"
QUEUE_DRAIN_METRIC: Final = "carpool_queue_drain_seconds"

MODEL_SERVER_COMMAND: Final = ("carpool", "model-server")
SIDECAR_COMMAND: Final = ("carpool", "sidecar")


class ModelServerFlag:
    """The `carpool model-server` options the operator sets (carpool_model_server.main)."""

    HANDLER: Final = "--handler"
    MODEL_NAME: Final = "--model-name"
    MODEL_PATH: Final = "--model-path"
    SOCKET: Final = "--socket"
    METRICS_HOST: Final = "--metrics-host"
    METRICS_PORT: Final = "--metrics-port"
    DEVICE: Final = "--device"
    DTYPE: Final = "--dtype"
    MAX_BATCH_SIZE: Final = "--max-batch-size"
    DRAIN_SECONDS: Final = "--drain-seconds"
    TORCH_THREADS: Final = "--torch-threads"
    REQUIRE_GPU: Final = "--require-gpu"


class SidecarFlag:
    """The `carpool sidecar` options the operator sets (carpool_sidecar.main)."""

    MODEL_NAME: Final = "--model-name"
    MODEL_SERVER: Final = "--model-server"
    HOST: Final = "--host"
    PORT: Final = "--port"
    DRAIN_SECONDS: Final = "--drain-seconds"
    DRAIN_DELAY_SECONDS: Final = "--drain-delay-seconds"
    CONFIG_FILE: Final = "--config-file"
    GRPC_PORT: Final = "--grpc-port"
    FRONT_PROCESSES: Final = "--front-processes"


# How the model server's termination message starts when its model failed to load; the
# operator reports such a message as ModelLoadFailed.
LOAD_FAILED = "model load failed: "


def default_flag(name: str) -> str:
    """The operator's flag for a default it applies, by setting name: `--default-max-wait-ms`;
    the chart passes the same as `default_variable(name)`."""
    return "--default-" + name.replace("_", "-")


def default_variable(name: str) -> str:
    """The operator's variable for a default it applies: `CARPOOL_DEFAULT_MAX_WAIT_MS`."""
    return "CARPOOL_DEFAULT_" + name.upper()
