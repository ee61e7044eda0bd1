"""The operator's defaults (flags or CARPOOL_DEFAULT_* variables): checked once, used by render."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.knobs import other_value

from carpool.contract.batching import KNOBS, Batching
from carpool.contract.pod import default_variable as variable
from carpool_operator.defaults import (
    DEFAULT_IMAGE,
    NAMES,
    Defaults,
    DefaultsError,
    Setting,
    parse_defaults,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = {
    "apiVersion": "carpool.dev/v1alpha1",
    "kind": "BatchedModel",
    "metadata": {"name": "plain"},
    "spec": {"model": {"handler": "toy"}},
}


def carpool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # No CARPOOL_DEFAULT_* from the caller's environment: each test says what it sets.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_DEFAULT_")}
    return subprocess.run(
        [sys.executable, "-m", "carpool", *args],
        env={**clean, **(env or {})},
        input=yaml.safe_dump(MODEL),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_nothing_given_means_the_built_in_defaults() -> None:
    assert parse_defaults({}) == Defaults(image=DEFAULT_IMAGE, batching=Batching())


def test_every_setting_parses_from_text() -> None:
    # Every knob of the table with a value other than its built-in default, and the images.
    knobs = {knob.attribute: other_value(knob) for knob in KNOBS}
    texts = {
        "image": "registry.local:5000/carpool:1",
        "cuda_image": "registry.local:5000/carpool:1-cu128",
        "sidecar_image": "registry.local:5000/sidecar:1",
        "runtime_class_name": "nvidia",
        **{name: str(value) for name, value in knobs.items()},
    }
    assert set(texts) == set(NAMES)
    given = {name: Setting(variable(name), text) for name, text in texts.items()}
    assert parse_defaults(given) == Defaults(
        image="registry.local:5000/carpool:1",
        cuda_image="registry.local:5000/carpool:1-cu128",
        sidecar_image="registry.local:5000/sidecar:1",
        runtime_class_name="nvidia",
        batching=Batching(**knobs),
    )


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("max_batch_size", "0", "must be an integer from 1 to 1024"),
        ("max_batch_size", "32.5", "must be an integer from 1 to 1024"),
        ("max_wait_ms", "", "must be an integer from 0 to 10000"),
        ("timeout_ms", "30s", "must be an integer from 1 to 3600000"),
        ("dispatch", "eager", "must be one of timed, adaptive, fixed"),
        ("image", "Not An Image", "not a valid image reference"),
        ("cuda_image", "", "not a valid image reference"),
        ("runtime_class_name", "Nvidia_Runtime", "not a valid RuntimeClass name"),
    ],
)
def test_a_bad_value_names_its_source_and_value(name: str, text: str, problem: str) -> None:
    with pytest.raises(DefaultsError) as raised:
        parse_defaults({name: Setting(variable(name), text)})
    assert str(raised.value) == f"{variable(name)}={text!r}: {problem}"


def test_a_bad_variable_stops_the_operator_with_a_clear_message() -> None:
    result = carpool("operator", env={"CARPOOL_DEFAULT_MAX_BATCH_SIZE": "lots"})
    assert result.returncode == 2
    message = "CARPOOL_DEFAULT_MAX_BATCH_SIZE='lots': must be an integer from 1 to 1024"
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_render_takes_the_same_defaults_as_flags_or_variables() -> None:
    by_env = carpool(
        "render", "-f", "-",
        env={"CARPOOL_DEFAULT_MAX_BATCH_SIZE": "48", "CARPOOL_DEFAULT_DISPATCH": "fixed"},
    )  # fmt: skip
    by_flag = carpool(
        "render", "-f", "-", "--default-max-batch-size=48", "--default-dispatch=fixed"
    )
    for result in (by_env, by_flag):
        assert result.returncode == 0, result.stderr
        (config,) = [m for m in yaml.safe_load_all(result.stdout) if m["kind"] == "ConfigMap"]
        settings = json.loads(config["data"]["batching.json"])
        assert (settings["maxBatchSize"], settings["dispatch"]) == (48, "fixed")

    wrong = carpool("render", "-f", "-", "--default-max-wait-ms=-1")
    assert wrong.returncode == 2
    assert "--default-max-wait-ms='-1': must be an integer from 0 to 10000" in wrong.stderr
