"""The pod the operator renders, read by the two programs it runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import click
import pytest

from carpool.contract.frames import socket_for
from carpool.contract.pod import (
    CONFIG_DIR,
    CONFIG_FILE,
    DRAIN_SECONDS,
    GRPC_PORT,
    MODEL_MAX_BATCH_SIZE,
    MODEL_SERVER_COMMAND,
    MODEL_SERVER_URL,
    SIDECAR_COMMAND,
    SIDECAR_PORT,
    SOCKET_DIR,
    SOCKET_PATH,
)
from carpool_model_server import config as model_server_config
from carpool_model_server.app import probe_app
from carpool_model_server.main import command as model_server_command
from carpool_operator.render import render
from carpool_sidecar.app import ROUTES
from carpool_sidecar.main import command as sidecar_command

BODY = {
    "metadata": {"name": "m", "namespace": "ml"},
    "spec": {"model": {"handler": "torchscript", "modelPath": "/models/m.pt"}},
}


@pytest.fixture(autouse=True)
def _no_carpool_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The programs read CARPOOL_* variables too; only the command lines count here.
    for name in [name for name in os.environ if name.startswith("CARPOOL_")]:
        monkeypatch.delenv(name)


def pod_containers(body: dict[str, Any] = BODY) -> dict[str, dict[str, Any]]:
    (deployment,) = [m for m in render(body) if m["kind"] == "Deployment"]
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return {container["name"]: container for container in containers}


def pod_commands() -> dict[str, list[str]]:
    return {name: container["command"] for name, container in pod_containers().items()}


def parse(command: click.Command, argv: list[str]) -> dict[str, Any]:
    """The options `argv` gives `command`; click refuses a flag it does not define."""
    return command.make_context(argv[1], argv[2:]).params


def test_the_model_server_reads_its_pod_command() -> None:
    argv = pod_commands()["model-server"]
    assert tuple(argv[:2]) == MODEL_SERVER_COMMAND
    config = model_server_config.parse(parse(model_server_command, argv))
    assert config.handler == "torchscript"
    assert config.model_path == Path("/models/m.pt")
    assert config.socket == Path(SOCKET_PATH)
    assert config.metrics_host == "0.0.0.0"
    assert config.max_batch_size == MODEL_MAX_BATCH_SIZE
    assert config.drain_seconds == DRAIN_SECONDS


def test_the_sidecar_reads_its_pod_command() -> None:
    argv = pod_commands()["sidecar"]
    assert tuple(argv[:2]) == SIDECAR_COMMAND
    options = parse(sidecar_command, argv)
    assert options["model_name"] == "m"
    assert options["model_server"] == MODEL_SERVER_URL == f"unix://{SOCKET_PATH}"
    assert (options["host"], options["port"]) == ("0.0.0.0", SIDECAR_PORT)
    assert options["drain_seconds"] == DRAIN_SECONDS
    assert options["config_file"] == f"{CONFIG_DIR}/{CONFIG_FILE}"
    assert options["grpc_port"] == GRPC_PORT


def test_the_sidecar_listens_where_its_container_ports_point() -> None:
    sidecar = pod_containers()["sidecar"]
    options = parse(sidecar_command, sidecar["command"])
    ports = {port["name"]: port["containerPort"] for port in sidecar["ports"]}
    assert ports == {"http": options["port"], "grpc": options["grpc_port"]}


def test_the_pods_probes_and_scrapes_ask_for_paths_its_containers_serve() -> None:
    body = {**BODY, "spec": {**BODY["spec"], "monitoring": {"podMonitor": True}}}
    children = {m["kind"]: m for m in render(body, podmonitor_api=True)}
    endpoints = children["PodMonitor"]["spec"]["podMetricsEndpoints"]
    containers = children["Deployment"]["spec"]["template"]["spec"]["containers"]
    model_server = probe_app(cast(Any, None))  # its routes only: nothing is served
    served = {
        "model-server": {r.resource.canonical for r in model_server.router.routes() if r.resource},
        "sidecar": {path for method, path, *_ in ROUTES if method == "GET"},
    }
    for container in containers:
        asked = {
            container[probe]["httpGet"]["path"]
            for probe in ("livenessProbe", "readinessProbe", "startupProbe")
            if probe in container
        }
        ports = {port["name"] for port in container["ports"]}
        asked |= {endpoint["path"] for endpoint in endpoints if endpoint["port"] in ports}
        assert len(asked) == 3, (container["name"], asked)  # live, ready, metrics
        assert asked <= served[container["name"]], container["name"]


def test_a_sidecar_without_grpc_is_told_so() -> None:
    body = {**BODY, "spec": {**BODY["spec"], "grpc": {"enabled": False}}}
    sidecar = pod_containers(body)["sidecar"]
    assert parse(sidecar_command, sidecar["command"])["grpc_port"] == 0
    assert [port["name"] for port in sidecar["ports"]] == ["http"]


def test_a_local_run_defaults_to_what_the_pod_is_told() -> None:
    """`carpool sidecar` and `carpool model-server` started by hand meet like in a pod."""
    sidecar = parse(sidecar_command, ["carpool", "sidecar", "--model-name", "m"])
    assert sidecar["model_server"] == MODEL_SERVER_URL
    assert sidecar["port"] == SIDECAR_PORT
    assert sidecar["drain_seconds"] == DRAIN_SECONDS
    assert sidecar["grpc_port"] == GRPC_PORT
    argv = ["carpool", "model-server", "--handler", "toy", "--socket", SOCKET_PATH]
    model_server = model_server_config.parse(parse(model_server_command, argv))
    assert model_server.max_batch_size == MODEL_MAX_BATCH_SIZE
    assert model_server.drain_seconds == DRAIN_SECONDS


def test_the_framed_socket_lies_in_the_shared_socket_folder() -> None:
    # Both containers mount only SOCKET_DIR: a framed socket elsewhere would not be shared.
    assert Path(socket_for(SOCKET_PATH)).parent == Path(SOCKET_DIR)
