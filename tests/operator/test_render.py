"""`render`: the manifests a BatchedModel becomes, checked against Kubernetes 1.35's schemas."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from carpool.contract.batching import DISPATCH_MODES, KNOBS, Batching
from carpool.contract.pod import MODEL_MAX_BATCH_SIZE
from carpool.engine.settings import BatchingSettings, apply_file
from carpool_operator.defaults import DEFAULT_SIDECAR_IMAGE, Defaults
from carpool_operator.render import DEFAULT_IMAGE, render
from carpool_operator.schema import apply_defaults, validate
from carpool_operator.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD = yaml.safe_load((ROOT / "crds" / "batchedmodels.carpool.dev.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def model(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": "m", "namespace": "ml", "uid": "0f6d7c9e-uid", "generation": 3},
        "spec": {"model": {"handler": "toy"}},
    }
    for key, value in spec.items():
        body["spec"][key] = value
    return body


def by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {manifest["kind"]: manifest for manifest in manifests}


def containers(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]
    return {container["name"]: container for container in pod["containers"]}


SPECS: dict[str, dict[str, Any]] = {
    "minimal": model(),
    "gpu": model(
        model={"handler": "text-embedding", "device": "cuda:0", "dtype": "fp16"},
        resources={"gpu": 2, "cpu": "4", "memory": "16Gi"},
        nodeSelector={"nvidia.com/gpu.present": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    ),
    "pvc": model(
        model={
            "handler": "torchscript",
            "modelPath": "/weights/model.pt",
            "weights": {"pvc": {"claimName": "weights", "mountPath": "/weights"}},
        },
        replicas=3,
    ),
    "uri": model(
        model={
            "handler": "mypkg.models:Classifier",
            "weights": {"uri": {"url": "https://example.com/model.pt", "mountPath": "/w"}},
            "env": [{"name": "HF_HOME", "value": "/tmp/hf"}],
            "args": ["--warmup-sizes", "1,8"],
        },
        imagePullSecrets=[{"name": "registry"}],
        serviceAccountName="models",
        priorityClassName="inference",
        affinity={"nodeAffinity": {}},
    ),
    "autoscaled": model(
        autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6},
        monitoring={"podMonitor": True, "labels": {"release": "kube-prometheus-stack"}},
        service={"type": "LoadBalancer", "port": 8080},
        grpc={"port": 443},
    ),
    "external-scaler": model(autoscaling={"external": True}),
    "gpu-tuned": model(
        model={
            "handler": "text-embedding",
            "torchThreads": 3,
            "loadTimeoutSeconds": 1200,
            "weights": {"storageUri": "hf://sentence-transformers/all-MiniLM-L6-v2"},
        },
        resources={"gpu": 1, "cpu": "1500m"},
        runtimeClassName="nvidia",
        rollout={"maxSurge": 1, "maxUnavailable": "50%"},
        shutdown={"drainDelaySeconds": 0},
        grpc={"enabled": False},
    ),
    "storage": model(
        model={
            "handler": "torchscript",
            "modelPath": "/weights/model.pt",
            "weights": {
                "storageUri": "s3://models/m.tar.gz",
                "secretName": "store",
                "mountPath": "/weights",
            },
        },
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_manifest_is_valid_kubernetes_1_35(name: str) -> None:
    for manifest in render(SPECS[name], podmonitor_api=True):
        if manifest["kind"] == "PodMonitor":
            continue  # a CRD of the Prometheus operator: not in the Kubernetes schemas
        kubernetes_validate.validate(manifest, "1.35.0", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_render_valid_manifests(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    for manifest in render(body, podmonitor_api=False):
        kubernetes_validate.validate(manifest, "1.35.0", strict=True)


def test_children_are_owned_labelled_and_namespaced() -> None:
    for manifest in render(SPECS["autoscaled"], podmonitor_api=True):
        metadata = manifest["metadata"]
        assert metadata["namespace"] == "ml"
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "carpool"
        assert metadata["labels"]["app.kubernetes.io/instance"] == "m"
        (owner,) = metadata["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("BatchedModel", "m", "0f6d7c9e-uid")
        assert owner["controller"] is True


def test_pod_layout_follows_the_architecture() -> None:
    manifests = render(SPECS["gpu"])
    pod = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]
    server, sidecar = containers(manifests)["model-server"], containers(manifests)["sidecar"]

    assert server["command"][:4] == ["carpool", "model-server", "--handler", "text-embedding"]
    assert "--socket" in server["command"] and "/run/carpool/model.sock" in server["command"]
    assert server["command"][server["command"].index("--metrics-port") + 1] == "9091"
    assert server["command"][server["command"].index("--device") + 1] == "cuda:0"
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert sidecar["command"] == [
        "carpool", "sidecar", "--model-name", "m",
        "--model-server", "unix:///run/carpool/model.sock",
        "--host", "0.0.0.0", "--port", "8080", "--grpc-port", "8081",
        "--drain-seconds", "30",
        "--drain-delay-seconds", "10",
        "--config-file", "/etc/carpool/batching.json",
    ]  # fmt: skip
    assert [(port["name"], port["containerPort"]) for port in sidecar["ports"]] == [
        ("http", 8080),
        ("grpc", 8081),
    ]
    for container in (server, sidecar):
        socket_mount = {"name": "socket", "mountPath": "/run/carpool"}
        assert socket_mount in container["volumeMounts"]
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"

    service = by_kind(manifests)["Service"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 80, "http"),
        ("grpc", 8081, "grpc"),
    ]


def service_ports(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {port["name"]: port for port in by_kind(manifests)["Service"]["spec"]["ports"]}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_grpc_is_served_and_exposed_by_default() -> None:
    manifests = render(SPECS["minimal"])
    sidecar = containers(manifests)["sidecar"]
    assert flag(sidecar["command"], "--grpc-port") == "8081"
    assert {"name": "grpc", "containerPort": 8081, "protocol": "TCP"} in sidecar["ports"]
    ports = service_ports(manifests)
    # A mesh or gateway reads appProtocol to speak HTTP/2 to the grpc port, HTTP/1 to http.
    assert ports["grpc"] == {
        "name": "grpc",
        "port": 8081,
        "targetPort": "grpc",
        "protocol": "TCP",
        "appProtocol": "grpc",
    }
    assert ports["http"]["appProtocol"] == "http"


def test_grpc_service_port_is_a_setting() -> None:
    manifests = render(SPECS["autoscaled"])
    ports = service_ports(manifests)
    assert (ports["http"]["port"], ports["grpc"]["port"]) == (8080, 443)
    assert ports["grpc"]["targetPort"] == "grpc"  # the sidecar listens on 8081 still
    assert flag(containers(manifests)["sidecar"]["command"], "--grpc-port") == "8081"


def test_sidecar_front_processes_reach_its_command() -> None:
    one = containers(render(SPECS["minimal"]))["sidecar"]["command"]
    assert "--front-processes" not in one
    fronts = model(sidecar={"frontProcesses": 3, "resources": {"cpu": "4"}})
    causes = validate(apply_defaults(fronts, SCHEMA), SCHEMA)
    assert causes == []
    command = containers(render(fronts))["sidecar"]["command"]
    assert flag(command, "--front-processes") == "3"
    too_many = validate(apply_defaults(model(sidecar={"frontProcesses": 0}), SCHEMA), SCHEMA)
    assert [cause.field for cause in too_many] == ["spec.sidecar.frontProcesses"]


def test_grpc_can_be_turned_off() -> None:
    manifests = render(SPECS["gpu-tuned"])
    sidecar = containers(manifests)["sidecar"]
    # Said explicitly: a sidecar left to its own default would listen on 8081.
    assert flag(sidecar["command"], "--grpc-port") == "0"
    assert [port["name"] for port in sidecar["ports"]] == ["http"]
    assert list(service_ports(manifests)) == ["http"]


def test_grpc_and_http_cannot_share_a_service_port() -> None:
    clash = model(service={"port": 9000}, grpc={"port": 9000})
    causes = validate(apply_defaults(clash, SCHEMA), SCHEMA)
    assert [cause.field for cause in causes] == ["spec.grpc.port"]
    assert "grpc.port and service.port name the same Service port" in causes[0].message
    off = model(service={"port": 9000}, grpc={"enabled": False, "port": 9000})
    assert validate(apply_defaults(off, SCHEMA), SCHEMA) == []


def test_batching_lives_in_the_config_map_only() -> None:
    fast = model(batching={"maxBatchSize": 8, "maxWaitMs": 1, "dispatch": "fixed"})
    slow = model(batching={"maxBatchSize": 256, "maxWaitMs": 50})
    fast_manifests, slow_manifests = by_kind(render(fast)), by_kind(render(slow))

    # Every knob, the spec's over the table's defaults.
    assert json.loads(fast_manifests["ConfigMap"]["data"]["batching.json"]) == {
        **Batching().as_file(),
        "maxBatchSize": 8,
        "maxWaitMs": 1,
        "dispatch": "fixed",
    }
    # The pod template must not change, or a re-tune would restart every pod.
    assert fast_manifests["Deployment"] == slow_manifests["Deployment"]
    volumes = fast_manifests["Deployment"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "batching", "configMap": {"name": "m-batching"}} in volumes


@pytest.mark.parametrize("end", ["minimum", "maximum"])
def test_the_sidecar_accepts_the_batching_file_rendered_at_every_bound(end: str) -> None:
    # A file the sidecar refused would be ignored: the pods would keep their old settings.
    batching = {knob.key: getattr(knob, end) for knob in KNOBS if not knob.choices}
    for dispatch in DISPATCH_MODES:
        body = model(
            model={"handler": "toy", "maxBatchSize": 1024},
            batching={**batching, "dispatch": dispatch},
        )
        content = by_kind(render(body))["ConfigMap"]["data"]["batching.json"]
        settings = apply_file(BatchingSettings(), content.encode())
        assert settings.max_batch_size == batching["maxBatchSize"]
        assert settings.dispatch == dispatch


def _flag(command: list[str], name: str) -> str:
    assert command.count(name) == 1, f"{name} should appear once in {command}"
    return command[command.index(name) + 1]


def test_model_limit_is_the_model_servers_max_batch_size() -> None:
    """spec.model.maxBatchSize is what the model server accepts and warms up."""
    default = render(model())
    assert _flag(containers(default)["model-server"]["command"], "--max-batch-size") == "64"
    big = render(model(model={"handler": "toy", "maxBatchSize": 512}))
    assert _flag(containers(big)["model-server"]["command"], "--max-batch-size") == "512"
    # Warm-up depends on it: a new limit is a new pod template, so the pods roll.
    template = by_kind(default)["Deployment"]["spec"]["template"]
    assert by_kind(big)["Deployment"]["spec"]["template"] != template


def test_model_server_default_is_the_crd_default() -> None:
    """A spec without the key (carpool render -f) gets what the API server would fill in."""
    limit = SCHEMA["properties"]["spec"]["properties"]["model"]["properties"]["maxBatchSize"]
    assert limit["default"] == MODEL_MAX_BATCH_SIZE
    assert (limit["minimum"], limit["maximum"]) == (1, 1024)


@pytest.mark.parametrize(
    ("batching", "limit", "effective"),
    [(128, None, 64), (128, 256, 128), (1024, 1024, 1024), (8, 4, 4), (8, 16, 8)],
)
def test_sidecar_batches_are_held_to_the_model_limit(
    batching: int, limit: int | None, effective: int
) -> None:
    body = model(batching={"maxBatchSize": batching})
    if limit is not None:
        body["spec"]["model"]["maxBatchSize"] = limit
    config = by_kind(render(body))["ConfigMap"]
    assert json.loads(config["data"]["batching.json"])["maxBatchSize"] == effective


def test_optional_children_follow_the_spec() -> None:
    assert set(by_kind(render(SPECS["minimal"]))) == {"ConfigMap", "Deployment", "Service"}
    assert "PodDisruptionBudget" in by_kind(render(SPECS["pvc"]))

    scaled = by_kind(render(SPECS["autoscaled"], podmonitor_api=True))
    assert "replicas" not in scaled["Deployment"]["spec"]  # the HPA owns it
    metric = scaled["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]
    assert metric == {
        "metric": {"name": "carpool_queue_items"},
        "target": {"type": "AverageValue", "averageValue": "16"},
    }
    assert "PodDisruptionBudget" in scaled  # minReplicas 2
    endpoints = scaled["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert [endpoint["port"] for endpoint in endpoints] == ["http", "metrics"]
    assert "PodMonitor" not in by_kind(render(SPECS["autoscaled"], podmonitor_api=False))


def test_the_hpa_also_scales_on_the_predicted_drain_when_asked() -> None:
    autoscaling = {"enabled": True, "targetQueueItemsPerPod": 32, "targetQueueDrainMs": 100}
    hpa = by_kind(render(model(autoscaling=autoscaling)))["HorizontalPodAutoscaler"]
    targets = {
        metric["pods"]["metric"]["name"]: metric["pods"]["target"]
        for metric in hpa["spec"]["metrics"]
    }
    assert targets == {
        "carpool_queue_items": {"type": "AverageValue", "averageValue": "32"},
        "carpool_queue_drain_seconds": {"type": "AverageValue", "averageValue": "100m"},
    }


@pytest.mark.parametrize(
    ("asked", "autoscaling", "rendered", "hpa", "budget"),
    [
        (1, {}, 1, False, False),
        (3, {}, 3, False, True),
        (3, {"enabled": True, "minReplicas": 1}, None, True, False),
        (3, {"enabled": True, "minReplicas": 2}, None, True, True),
        # Another controller's count: neither replicas nor an HPA; a budget whatever it scales to.
        (1, {"external": True}, None, False, True),
        (3, {"external": True, "minReplicas": 1, "maxReplicas": 9}, None, False, True),
    ],
)
def test_who_sets_the_replica_count(
    asked: int, autoscaling: dict[str, Any], rendered: int | None, hpa: bool, budget: bool
) -> None:
    manifests = by_kind(render(model(replicas=asked, autoscaling=autoscaling)))
    assert manifests["Deployment"]["spec"].get("replicas") == rendered
    assert ("HorizontalPodAutoscaler" in manifests) is hpa
    assert ("PodDisruptionBudget" in manifests) is budget


def test_weights_sources() -> None:
    pvc = by_kind(render(SPECS["pvc"]))["Deployment"]["spec"]["template"]["spec"]
    assert {
        "name": "weights",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    } in pvc["volumes"]
    server = pvc["containers"][0]
    assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in server["volumeMounts"]
    assert server["command"][server["command"].index("--model-path") + 1] == "/weights/model.pt"

    uri = by_kind(render(SPECS["uri"]))["Deployment"]["spec"]["template"]["spec"]
    (fetcher,) = uri["initContainers"]
    assert fetcher["command"][-1] == "https://example.com/model.pt"
    assert "/w/model.pt" in fetcher["command"]
    assert {"name": "weights", "emptyDir": {}} in uri["volumes"]
    assert uri["containers"][0]["command"][-2:] == ["--warmup-sizes", "1,8"]


def test_grace_period_outlasts_both_drains() -> None:
    """Both containers drain for the same time after SIGTERM; the kubelet waits longer."""
    manifests = render(model())
    pod = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]
    drains = set()
    for container in containers(manifests).values():
        command = container["command"]
        drains.add(float(command[command.index("--drain-seconds") + 1]))
    (drain,) = drains
    assert 0 < drain < pod["terminationGracePeriodSeconds"]


def test_images_default_to_the_operator_images() -> None:
    images = {n: c["image"] for n, c in containers(render(model())).items()}
    assert images == {"model-server": DEFAULT_IMAGE, "sidecar": DEFAULT_SIDECAR_IMAGE}
    # An empty sidecar default runs the sidecar from the model image, as before the split.
    one = Defaults(image="registry.local/carpool:dev", sidecar_image="")
    custom = containers(render(model(), defaults=one))
    assert {c["image"] for c in custom.values()} == {"registry.local/carpool:dev"}

    split = Defaults(image="registry.local/model:1", sidecar_image="registry.local/sidecar:2")
    images_by_container = {
        n: c["image"] for n, c in containers(render(model(), defaults=split)).items()
    }
    assert images_by_container == {
        "model-server": "registry.local/model:1",
        "sidecar": "registry.local/sidecar:2",
    }
    # A model's own images beat the operator's.
    own = model(model={"handler": "toy", "image": "team/model:3"}, sidecar={"image": "team/sc:4"})
    images_by_container = {
        n: c["image"] for n, c in containers(render(own, defaults=split)).items()
    }
    assert images_by_container == {"model-server": "team/model:3", "sidecar": "team/sc:4"}


def test_operator_batching_defaults_fill_what_the_spec_leaves_out() -> None:
    defaults = Defaults(batching=Batching(max_batch_size=48, max_wait_ms=9, dispatch="fixed"))

    def settings(body: dict[str, Any]) -> dict[str, Any]:
        config = by_kind(render(body, defaults=defaults))["ConfigMap"]
        loaded: dict[str, Any] = json.loads(config["data"]["batching.json"])
        return loaded

    # The operator's defaults (48, 9, fixed) where the spec sets nothing, the table's elsewhere.
    assert settings(model()) == defaults.batching.as_file()
    tuned = settings(model(batching={"maxBatchSize": 8, "maxWaitMs": 0, "dispatch": "adaptive"}))
    assert (tuned["maxBatchSize"], tuned["maxWaitMs"], tuned["dispatch"]) == (8, 0, "adaptive")
    assert tuned["maxInflightBatches"] == 2


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"model": {"handler": "not a handler"}}, "InvalidHandler"),
        ({"model": {"handler": "module.without.class"}}, "InvalidHandler"),
        ({"model": {"handler": "toy", "image": "UPPER/case:tag"}}, "InvalidImage"),
        ({"model": {"handler": "toy"}, "sidecar": {"image": "bad image"}}, "InvalidImage"),
    ],
)
def test_unrealisable_specs_name_a_reason(spec: dict[str, Any], reason: str) -> None:
    body = model()
    body["spec"] = spec
    with pytest.raises(SpecError) as raised:
        render(body)
    assert raised.value.reason == reason


def test_operator_defaults_match_the_crd_defaults() -> None:
    # `carpool render` sees files without server defaults; the result must not differ
    # (batching has no CRD defaults: the operator's own fill it in, the same either way).
    for body in SPECS.values():
        defaulted = apply_defaults(copy.deepcopy(body), SCHEMA)
        assert render(defaulted, podmonitor_api=True) == render(body, podmonitor_api=True)


def pod_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]
    return pod


def gpu_model(**model_fields: Any) -> dict[str, Any]:
    return model(model={"handler": "toy", **model_fields}, resources={"gpu": 1})


def test_a_gpu_model_gets_the_cuda_image_and_must_find_its_gpu() -> None:
    defaults = Defaults(image="registry.local/carpool:1", cuda_image="registry.local/carpool:1-cu")
    gpu = containers(render(gpu_model(), defaults=defaults))
    assert gpu["model-server"]["image"] == "registry.local/carpool:1-cu"
    assert "--require-gpu" in gpu["model-server"]["command"]
    cpu = containers(render(model(), defaults=defaults))
    assert cpu["model-server"]["image"] == "registry.local/carpool:1"
    assert "--require-gpu" not in cpu["model-server"]["command"]
    # A model's own image is what it asked for, GPU or not.
    own = containers(render(gpu_model(image="team/model:cuda"), defaults=defaults))
    assert own["model-server"]["image"] == "team/model:cuda"


def test_gpu_pods_take_the_operators_runtime_class_unless_they_name_one() -> None:
    defaults = Defaults(runtime_class_name="nvidia")
    assert pod_of(render(gpu_model(), defaults=defaults))["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in pod_of(render(model(), defaults=defaults))
    assert "runtimeClassName" not in pod_of(render(gpu_model()))
    own = gpu_model()
    own["spec"]["runtimeClassName"] = "nvidia-cdi"
    assert pod_of(render(own, defaults=defaults))["runtimeClassName"] == "nvidia-cdi"


def test_gpu_rollouts_stop_a_pod_before_starting_one() -> None:
    def strategy(body: dict[str, Any]) -> Any:
        return by_kind(render(body))["Deployment"]["spec"].get("strategy")

    assert strategy(gpu_model()) == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert strategy(model()) is None  # Kubernetes' own 25% / 25%
    tuned = model(rollout={"maxUnavailable": 0})
    assert strategy(tuned)["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 0}
    assert strategy(SPECS["gpu-tuned"])["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": "50%"}


def test_startup_probe_waits_for_readiness_within_the_load_budget() -> None:
    server = containers(render(model()))["model-server"]
    startup = server["startupProbe"]
    assert startup["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert startup["periodSeconds"] * startup["failureThreshold"] == 600
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    slow = containers(render(SPECS["gpu-tuned"]))["model-server"]["startupProbe"]
    assert slow["periodSeconds"] * slow["failureThreshold"] == 1200


def test_pods_keep_serving_while_their_endpoints_go() -> None:
    manifests = render(model(shutdown={"drainDelaySeconds": 12}))
    pod, by_name = pod_of(manifests), containers(manifests)
    sidecar, server = by_name["sidecar"]["command"], by_name["model-server"]["command"]
    assert _flag(sidecar, "--drain-delay-seconds") == "12"
    # The model server gets SIGTERM when the sidecar stops accepting, not before.
    assert by_name["model-server"]["lifecycle"] == {"preStop": {"sleep": {"seconds": 12}}}
    drain = max(int(_flag(sidecar, "--drain-seconds")), int(_flag(server, "--drain-seconds")))
    assert pod["terminationGracePeriodSeconds"] > 12 + drain

    immediate = containers(render(SPECS["gpu-tuned"]))
    assert "lifecycle" not in immediate["model-server"]
    assert _flag(immediate["sidecar"]["command"], "--drain-delay-seconds") == "0"


@pytest.mark.parametrize(
    ("cpu", "threads"), [("500m", 1), ("1", 1), ("1500m", 1), ("2.5", 2), ("4", 4), ("64", 64)]
)
def test_torch_threads_follow_the_whole_cores_of_the_cpu_request(cpu: str, threads: int) -> None:
    server = containers(render(model(resources={"cpu": cpu})))["model-server"]
    assert _flag(server["command"], "--torch-threads") == str(threads)


def test_torch_threads_can_be_set() -> None:
    server = containers(render(SPECS["gpu-tuned"]))["model-server"]
    assert _flag(server["command"], "--torch-threads") == "3"


def test_storage_uri_is_fetched_by_an_init_container_with_the_secret() -> None:
    pod = pod_of(render(SPECS["storage"]))
    (fetcher,) = pod["initContainers"]
    assert fetcher["command"] == [
        "python", "-m", "carpool.storage", "s3://models/m.tar.gz", "/weights",
        "--credentials", "/var/run/secrets/carpool/weights",
    ]  # fmt: skip
    assert fetcher["image"] == pod["containers"][0]["image"]  # one image to pull
    assert {
        "name": "weights-credentials",
        "mountPath": "/var/run/secrets/carpool/weights",
        "readOnly": True,
    } in fetcher["volumeMounts"]
    assert {"name": "weights", "mountPath": "/weights"} in fetcher["volumeMounts"]
    assert {"name": "weights", "emptyDir": {}} in pod["volumes"]
    assert {"name": "weights-credentials", "secret": {"secretName": "store"}} in pod["volumes"]
    # The model server reads the weights but never mounts the credentials.
    server = pod["containers"][0]
    assert {"name": "weights", "mountPath": "/weights"} in server["volumeMounts"]
    assert all(mount["name"] != "weights-credentials" for mount in server["volumeMounts"])

    hub = pod_of(render(SPECS["gpu-tuned"]))["initContainers"][0]
    assert hub["command"][-2:] == ["hf://sentence-transformers/all-MiniLM-L6-v2", "/models"]
    assert {"name": "HF_HUB_OFFLINE", "value": "0"} in hub["env"]  # the image is offline


def test_pod_monitor_takes_extra_labels_but_keeps_its_own() -> None:
    labels = {"release": "kube-prometheus-stack", "app.kubernetes.io/managed-by": "someone"}
    body = model(monitoring={"podMonitor": True, "labels": labels})
    monitor = by_kind(render(body, podmonitor_api=True))["PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "carpool"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_pod_meets_the_restricted_pod_security_standard(name: str) -> None:
    from chart.pod_security import violations

    assert violations(pod_of(render(SPECS[name]))) == []


def model_server_args(body: dict[str, Any]) -> list[str]:
    return list(containers(render(body))["model-server"]["command"])


@pytest.mark.parametrize(
    ("handler", "weights", "model_path"),
    [
        ("image-classification", {"storageUri": "s3://models/vit/"}, "/models"),
        ("text-embedding", {"pvc": {"claimName": "w", "mountPath": "/w"}}, "/w"),
        (
            "torch-export",
            {"uri": {"url": "https://e.com/r.pt2", "fileName": "r.pt2"}},
            "/models/r.pt2",
        ),
    ],
)
def test_weights_and_a_built_in_handler_are_the_whole_recipe(
    handler: str, weights: dict[str, Any], model_path: str
) -> None:
    # The operator passes the fetched file or folder: no modelPath to repeat it.
    args = model_server_args(model(model={"handler": handler, "weights": weights}))
    assert args[args.index("--model-path") + 1] == model_path


def test_a_model_path_given_wins_and_none_is_invented() -> None:
    store = {"storageUri": "s3://models/m.tar.gz"}
    given = model_server_args(
        model(model={"handler": "torchscript", "modelPath": "/models/m.pt", "weights": store})
    )
    assert given[given.index("--model-path") + 1] == "/models/m.pt"
    # A user's own handler reads what it likes; MiniLM from the image needs no path.
    for handler, weights in (("my.models:Net", store), ("text-embedding", {"image": {}})):
        body = model(model={"handler": handler, "weights": weights})
        assert "--model-path" not in model_server_args(body)
