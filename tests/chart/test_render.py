"""The chart lints, renders and validates strictly, with defaults and every ci/ variant."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import kubernetes_validate
import pytest
import yaml
from chart.rendering import CHART, NAMESPACE, REPO, VARIANTS, Manifest, by_kind, helm, one, render

from carpool.contract.batching import Batching
from carpool_operator.defaults import Defaults

KUBERNETES_VERSION = "1.35"
# Kinds outside core Kubernetes: no schema in kubernetes-validate. Checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

VARIANT_IDS = ["defaults", *(path.stem for path in VARIANTS)]
VARIANT_FILES: list[tuple[Path, ...]] = [(), *((path,) for path in VARIANTS)]


@pytest.fixture(scope="module", params=VARIANT_FILES, ids=VARIANT_IDS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    values: tuple[Path, ...] = request.param
    return render(*values)


@pytest.mark.parametrize("values", VARIANT_FILES, ids=VARIANT_IDS)
def test_lint_strict(values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for path in values:
        args += ["--values", str(path)]
    assert "0 chart(s) failed" in helm(*args)


def test_every_manifest_validates_strictly(rendered: list[Manifest]) -> None:
    checked = 0
    for manifest in rendered:
        if (manifest["apiVersion"], manifest["kind"]) in CUSTOM_KINDS:
            continue
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            pytest.fail(
                f"{name} is invalid for Kubernetes {KUBERNETES_VERSION}: {path}: {error.message}"
            )
        checked += 1
    assert checked, "nothing was validated"


def test_namespaced_objects_name_the_release_namespace(rendered: list[Manifest]) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for manifest in rendered:
        if manifest["kind"] in cluster_scoped:
            assert "namespace" not in manifest["metadata"]
        else:
            assert manifest["metadata"].get("namespace"), manifest["metadata"]["name"]


def test_one_resource_kind_per_template_file() -> None:
    for template in (CHART / "templates").glob("*.yaml"):
        kinds = set(re.findall(r"^kind: (\w+)", template.read_text(), re.MULTILINE))
        assert len(kinds) <= 1, f"{template.name} renders {sorted(kinds)}"


def test_names_fit_in_63_characters() -> None:
    manifests = render(sets=("fullnameOverride=" + "x" * 80,))
    deployment = one(manifests, "Deployment")
    assert len(deployment["metadata"]["name"]) == 63
    for manifest in manifests:
        for value in manifest["metadata"].get("labels", {}).values():
            assert len(str(value)) <= 63


def test_selector_labels_are_a_stable_subset() -> None:
    deployment = one(render(), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    # A Deployment's selector is immutable: any change here breaks `helm upgrade`.
    assert selector == {
        "app.kubernetes.io/name": "carpool",
        "app.kubernetes.io/instance": "carpool",
        "app.kubernetes.io/component": "operator",
    }
    assert "app.kubernetes.io/version" not in selector
    assert "helm.sh/chart" not in selector
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


COMPONENTS = {
    "Deployment": "operator",
    "Service": "operator",
    "ServiceMonitor": "operator",
    "ServiceAccount": "rbac",
    "ClusterRole": "rbac",
    "ClusterRoleBinding": "rbac",
    "ConfigMap": "dashboard",
    "CustomResourceDefinition": "crd",
}


def test_each_object_names_its_own_component() -> None:
    manifests = render(sets=("serviceMonitor.enabled=true",))
    assert {manifest["kind"] for manifest in manifests} == set(COMPONENTS)
    for manifest in manifests:
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == COMPONENTS[manifest["kind"]], manifest
        assert labels["app.kubernetes.io/part-of"] == "carpool"
        assert labels["app.kubernetes.io/instance"] == "carpool"
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/component"] == "operator"


def test_operator_runs_one_replica_with_liveness_probe() -> None:
    deployment = one(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/carpool-dev/carpool-operator:0.1.0"
    assert container["command"][:2] == ["carpool", "operator"]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    (port,) = [p for p in container["ports"] if p["name"] == probe["port"]]
    assert port["containerPort"] == 8081
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "metrics": 8080}
    assert "--metrics-port=8080" in container["args"]
    assert "--metrics-host=0.0.0.0" in container["args"]  # Prometheus scrapes the pod IP
    assert "readinessProbe" not in container
    assert container["resources"]["limits"] and container["resources"]["requests"]


def _env(manifests: list[Manifest]) -> dict[str, str]:
    deployment = one(manifests, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container["env"]}


def test_batching_defaults_and_images_reach_the_operator_as_env() -> None:
    env = _env(render())
    assert env["CARPOOL_DEFAULT_SIDECAR_IMAGE"] == "ghcr.io/carpool-dev/carpool-sidecar:0.1.0"
    assert env["CARPOOL_DEFAULT_IMAGE"] == "ghcr.io/carpool-dev/carpool-model-server:0.1.0"
    assert env["CARPOOL_DEFAULT_MAX_BATCH_SIZE"] == "32"
    assert env["CARPOOL_DEFAULT_MAX_WAIT_MS"] == "5"
    assert env["CARPOOL_DEFAULT_MAX_INFLIGHT_BATCHES"] == "2"
    assert env["CARPOOL_DEFAULT_MAX_QUEUE_ITEMS"] == "1024"
    assert env["CARPOOL_DEFAULT_TIMEOUT_MS"] == "30000"
    assert env["CARPOOL_DEFAULT_MAX_BATCH_TOKENS"] == "0"
    assert env["CARPOOL_DEFAULT_DISPATCH"] == "timed"

    tuned = _env(render(sets=("defaults.maxBatchSize=64", "defaults.dispatch=fixed")))
    assert tuned["CARPOOL_DEFAULT_MAX_BATCH_SIZE"] == "64"
    assert tuned["CARPOOL_DEFAULT_DISPATCH"] == "fixed"


def _images(manifests: list[Manifest]) -> dict[str, str]:
    (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = _env(manifests)
    return {
        "operator": container["image"],
        "sidecar": env["CARPOOL_DEFAULT_SIDECAR_IMAGE"],
        "modelServer": env["CARPOOL_DEFAULT_IMAGE"],
        "modelServerCuda": env["CARPOOL_DEFAULT_CUDA_IMAGE"],
    }


def test_image_tags_follow_the_app_version(tmp_path: Path) -> None:
    """No tag is written down in values.yaml: a chart released as X runs images tagged X."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert {name: image["tag"] for name, image in values["images"].items()} == {
        "operator": "",
        "sidecar": "",
        "modelServer": "",
        "modelServerCuda": "",
    }
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    repository = "ghcr.io/carpool-dev/carpool"
    assert set(_images(render()).values()) == {
        f"{repository}-operator:{app_version}",
        f"{repository}-sidecar:{app_version}",
        f"{repository}-model-server:{app_version}",
        f"{repository}-model-server:{app_version}-cu128",  # the CUDA build, `make image-cuda`
    }

    helm("package", str(CHART), "--app-version", "9.8.7", "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("carpool-*.tgz")
    released = [
        doc
        for doc in yaml.safe_load_all(
            helm("template", "carpool", str(archive), "--set", "images.sidecar.tag=1.2.3")
        )
        if doc
    ]
    assert _images(released) == {
        "operator": f"{repository}-operator:9.8.7",
        "sidecar": f"{repository}-sidecar:1.2.3",  # a tag, when given, wins
        "modelServer": f"{repository}-model-server:9.8.7",
        "modelServerCuda": f"{repository}-model-server:9.8.7-cu128",
    }


def test_image_digest_pins_the_image() -> None:
    digest = "sha256:" + "ab" * 32
    manifests = render(sets=(f"images.operator.digest={digest}", f"images.sidecar.digest={digest}"))
    (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/carpool-dev/carpool-operator@{digest}"
    sidecar = _env(manifests)["CARPOOL_DEFAULT_SIDECAR_IMAGE"]
    assert sidecar == f"ghcr.io/carpool-dev/carpool-sidecar@{digest}"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("defaults.dispatch=eager",), "adaptive"),
        (("defaults.maxBatchSize=0",), "maxBatchSize"),
        (("defaults.maxWaitMs=2.5",), "maxWaitMs"),
        (("defaults.timeoutMs=3600001",), "timeoutMs"),
        (("images.operator.pullPolicy=Sometimes",), "pullPolicy"),
        (("operator.replicas=3",), "replicas"),
    ],
)
def test_schema_rejects_bad_values(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        render(sets=sets)


def test_every_value_is_documented_by_name() -> None:
    """Each key in values.yaml has a comment starting with its dotted name, and a schema entry."""
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    documented = set(re.findall(r"^\s*# ([a-zA-Z][\w.]*) -- ", text, re.MULTILINE))
    missing_comment: list[str] = []
    missing_schema: list[str] = []

    def walk(node: object, prefix: str, node_schema: dict[str, object]) -> None:
        if not isinstance(node, dict):
            return
        properties = node_schema.get("properties")
        for key, child in node.items():
            dotted = f"{prefix}{key}"
            assert re.fullmatch(r"[a-z][a-zA-Z0-9]*", key), f"{dotted} is not camelCase"
            # Maps of Kubernetes fields (resources) are documented as a whole.
            if prefix.startswith("operator.resources."):
                continue
            if dotted not in documented:
                missing_comment.append(dotted)
            child_schema = properties.get(key) if isinstance(properties, dict) else None
            if not isinstance(child_schema, dict) or not child_schema.get("description"):
                missing_schema.append(dotted)
                continue
            walk(child, dotted + ".", child_schema)

    walk(values, "", schema)
    assert not missing_comment, f"values without a '# <name> -- ' comment: {missing_comment}"
    assert not missing_schema, f"values without a schema description: {missing_schema}"


@pytest.mark.parametrize(
    "source",
    [REPO / "crds" / "batchedmodels.carpool.dev.yaml", REPO / "dashboards" / "carpool.json"],
    ids=["crd", "dashboard"],
)
def test_chart_files_are_the_repository_files(source: Path) -> None:
    """Helm reads nothing outside the chart folder: files/ links to the repository's files."""
    inside = CHART / "files" / source.parent.name / source.name
    assert inside.is_symlink(), f"{inside} should link to {source}"
    assert inside.resolve() == source.resolve()
    assert inside.read_text() == source.read_text()


def test_rendered_crd_is_the_repository_crd_with_lifecycle_policy() -> None:
    source = yaml.safe_load((REPO / "crds" / "batchedmodels.carpool.dev.yaml").read_text())
    kept = one(render(), "CustomResourceDefinition")
    assert kept["spec"] == source["spec"]
    assert kept["metadata"]["name"] == source["metadata"]["name"]
    assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    not_kept = one(render(sets=("crds.keep=false",)), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (not_kept["metadata"].get("annotations") or {})

    assert by_kind(render(sets=("crds.install=false",)), "CustomResourceDefinition") == []


def test_dashboard_configmap_is_labelled_for_grafana() -> None:
    configmap = one(render(), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    dashboard = json.loads(configmap["data"]["carpool.json"])
    assert dashboard == json.loads((REPO / "dashboards" / "carpool.json").read_text())

    moved = one(
        render(sets=("dashboard.namespace=monitoring", "dashboard.label=dashboards")),
        "ConfigMap",
    )
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["dashboards"] == "1"
    assert "grafana_dashboard" not in moved["metadata"]["labels"]
    assert by_kind(render(sets=("dashboard.enabled=false",)), "ConfigMap") == []


def test_service_monitor_scrapes_the_operator_pod() -> None:
    assert by_kind(render(), "ServiceMonitor") == []
    manifests = render(sets=("serviceMonitor.enabled=true", "serviceMonitor.labels.release=kps"))
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    deployment = one(manifests, "Deployment")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selects = monitor["spec"]["selector"]["matchLabels"]
    assert selects.items() <= service["metadata"]["labels"].items()
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        "metrics",
        "/metrics",
        "30s",
    )
    # ServiceMonitor port -> Service port -> the container port the operator's /metrics uses.
    (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (target,) = [p for p in container["ports"] if p["name"] == service_port["targetPort"]]
    assert f"--metrics-port={target['containerPort']}" in container["args"]


def test_notes_tell_the_next_step() -> None:
    notes = helm(
        "install", "carpool", str(CHART), "--dry-run=client", "--namespace", NAMESPACE
    ).split("NOTES:", 1)[1]
    assert "kubectl apply -f - <<EOF" in notes and "kind: BatchedModel" in notes
    assert "rollout status deployment/carpool" in notes
    assert "grafana_dashboard=1" in notes
    assert "kubectl delete crd batchedmodels.carpool.dev" in notes


def _operator_context(
    manifests: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> tuple[click.Context, Defaults]:
    """Parse the chart's args and env as `carpool operator` does; its defaults, checked."""
    from carpool_operator.main import command
    from carpool_operator.options import defaults_from

    (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["carpool", "operator"]
    for name, value in _env(manifests).items():
        monkeypatch.setenv(name, value)
    context = command.make_context("operator", list(container["args"]))
    return context, defaults_from(context)


def test_operator_command_accepts_the_chart_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The args and env the chart gives `carpool operator` parse as the operator reads them."""
    manifests = render(sets=("operator.verbose=true", "operator.healthPort=9000"))
    context, defaults = _operator_context(manifests, monkeypatch)
    assert context.params["liveness"] == "http://0.0.0.0:9000/healthz"
    assert context.params["metrics_port"] == 8080
    assert context.params["metrics_host"] == "0.0.0.0"
    assert context.params["verbose"] is True
    assert context.params["standalone"] is True
    assert context.params["resync_seconds"] == 60.0
    assert context.params["namespaces"] == ()  # every namespace
    assert defaults == Defaults(
        image="ghcr.io/carpool-dev/carpool-model-server:0.1.0",
        sidecar_image="ghcr.io/carpool-dev/carpool-sidecar:0.1.0",
        batching=Batching(),  # the chart's defaults are the operator's built-in ones
    )


def test_watch_namespaces_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """operator.watchNamespaces: one --namespace each; a Role and RoleBinding in each."""
    manifests = render(sets=("operator.watchNamespaces={ml,team-a}",))
    context, _ = _operator_context(manifests, monkeypatch)
    assert context.params["namespaces"] == ("ml", "team-a")
    for kind in ("Role", "RoleBinding"):
        assert [doc["metadata"]["namespace"] for doc in by_kind(manifests, kind)] == [
            "ml",
            "team-a",
        ]
    rules = one(manifests, "ClusterRole")["rules"]
    # kopf lists and watches namespaces to find the named ones; cluster-wide it needs not.
    namespaces = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    assert namespaces in rules
    assert namespaces not in one(render(), "ClusterRole")["rules"]
    with pytest.raises(AssertionError, match="watchNamespaces"):
        render(sets=("operator.watchNamespaces={Not_A_Namespace}",))
    notes = helm(
        "install", "carpool", str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
        "--set", "operator.watchNamespaces={ml,team-a}",
    )  # fmt: skip
    assert "only in: ml, team-a" in notes


@pytest.mark.parametrize("values", VARIANT_FILES, ids=VARIANT_IDS)
def test_every_variant_gives_the_operator_valid_defaults(
    values: tuple[Path, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's schema admits no default the operator would refuse to start with."""
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())["defaults"]
    for path in values:
        chart_values.update(yaml.safe_load(path.read_text()).get("defaults", {}))
    _, defaults = _operator_context(render(*values), monkeypatch)
    assert defaults.batching.as_file() == chart_values


def test_packaged_chart_carries_the_crd_and_dashboard(tmp_path: Path) -> None:
    """`helm package` stores what files/ links to: the chart archive stands on its own."""
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("carpool-*.tgz")
    manifests = [
        doc
        for doc in yaml.safe_load_all(
            helm("template", "carpool", str(archive), "--namespace", NAMESPACE)
        )
        if doc
    ]
    crd = yaml.safe_load((REPO / "crds" / "batchedmodels.carpool.dev.yaml").read_text())
    assert one(manifests, "CustomResourceDefinition")["spec"] == crd["spec"]
    dashboard = json.loads((REPO / "dashboards" / "carpool.json").read_text())
    assert json.loads(one(manifests, "ConfigMap")["data"]["carpool.json"]) == dashboard
    listing = helm("show", "chart", str(archive))
    assert "name: carpool" in listing


def test_gpu_defaults_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    _, defaults = _operator_context(render(), monkeypatch)
    assert defaults.cuda_image == f"ghcr.io/carpool-dev/carpool-model-server:{app_version}-cu128"
    assert defaults.runtime_class_name == ""

    gpu = render(sets=("gpu.runtimeClassName=nvidia", "images.modelServerCuda.tag=2.0-cu130"))
    _, defaults = _operator_context(gpu, monkeypatch)
    assert defaults.runtime_class_name == "nvidia"
    assert defaults.cuda_image == "ghcr.io/carpool-dev/carpool-model-server:2.0-cu130"
    assert defaults.image == f"ghcr.io/carpool-dev/carpool-model-server:{app_version}"


def test_adapter_rules_serve_the_metric_the_hpas_read() -> None:
    from carpool_operator.render import horizontal_pod_autoscaler
    from carpool_operator.spec import ModelSpec

    def adapter_rules(manifests: list[Manifest]) -> list[Manifest]:
        return [m for m in by_kind(manifests, "ConfigMap") if "config.yaml" in m["data"]]

    assert adapter_rules(render()) == []  # off unless asked for
    (rules,) = adapter_rules(
        render(
            sets=(
                "customMetrics.adapterRules.enabled=true",
                "customMetrics.adapterRules.namespace=mon",
            )
        )
    )
    # The name and namespace the install docs give prometheus-adapter (rules.existing).
    assert (rules["metadata"]["name"], rules["metadata"]["namespace"]) == (
        "carpool-adapter-rules",
        "mon",
    )
    served = yaml.safe_load(rules["data"]["config.yaml"])["rules"]
    hpa = horizontal_pod_autoscaler(
        ModelSpec(name="m", namespace="ml", uid="", generation=1, handler="toy", image="carpool:1")
    )
    (metric,) = hpa["spec"]["metrics"]
    wanted = metric["pods"]["metric"]["name"]
    # The HPA's metric, and the queue's predicted drain for HPAs of one's own.
    names = {rule["name"]["as"] for rule in served}
    assert names == {wanted, "carpool_queue_drain_seconds"}
    for rule in served:
        assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
        # Per pod: the HPA asks for pods, so the series must map to pods and namespaces.
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_the_cuda_build_is_named_alike_everywhere() -> None:
    """`make image-cuda`'s tag is what the chart and the operator run for GPU models."""
    from carpool_operator.defaults import DEFAULT_CUDA_IMAGE, DEFAULT_IMAGE

    (cuda,) = re.findall(r"^CUDA \?= (cu\d+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["images"]["modelServerCuda"]["tagSuffix"] == f"-{cuda}"
    assert f"{DEFAULT_IMAGE}-{cuda}" == DEFAULT_CUDA_IMAGE
    for doc in ("Dockerfile", "README.md", "docs/install.md", "docs/operator.md"):
        named = set(re.findall(r"download\.pytorch\.org/whl/(cu\d+)", (REPO / doc).read_text()))
        assert named <= {cuda}, f"{doc} names CUDA builds {named}, `make image-cuda` {cuda}"
