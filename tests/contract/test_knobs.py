"""Every batching knob, from the contract's one table through every entry point.

A knob is a field of `carpool.contract.batching.Batching`; nothing else names it by hand. This
walks each one through the sidecar's flag and variable, `carpool serve`, `carpool.batch()`,
the operator's default flag and variable, the CRD, the chart's values, schema and rendered
environment, and the docs' tables, and checks that the files written from the table are
current (`make generate`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.rendering import HELM, render
from click.testing import CliRunner
from support.knobs import other_value

import carpool
from carpool.contract.batching import KNOBS, Knob
from carpool.contract.generate import WRITERS
from carpool.contract.pod import default_flag, default_variable
from carpool.engine.settings import BatchingSettings
from carpool.knob_flags import knob_arguments
from carpool.serve import command as serve_command
from carpool_operator.render_cli import command as render_command
from carpool_sidecar.main import command as sidecar_command

ROOT = Path(__file__).resolve().parents[2]


def _params(command: Any, args: list[str]) -> dict[str, Any]:
    """The parameters click parses from `args` and the environment, without running it."""
    with command.make_context(command.name, args) as context:
        return dict(context.params)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_files_written_from_the_table_are_current(name: str) -> None:
    text = (ROOT / name).read_text()
    assert WRITERS[name](text) == text, f"{name} is stale: run `make generate`"


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.key)
def test_the_sidecar_takes_each_knob_as_flag_and_variable(
    knob: Knob, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = other_value(knob)
    given = _params(sidecar_command, ["--model-name", "m", knob.flag, str(value)])
    assert given[knob.attribute] == value
    monkeypatch.setenv(knob.variable, str(value))
    from_env = _params(sidecar_command, ["--model-name", "m"])
    assert from_env[knob.attribute] == value
    help_text = CliRunner().invoke(sidecar_command, ["--help"]).output
    assert knob.flag in help_text and knob.variable in help_text


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.key)
def test_carpool_serve_hands_each_knob_to_its_sidecar(knob: Knob) -> None:
    value = other_value(knob)
    given = _params(serve_command, ["--handler", "toy", knob.flag, str(value)])
    flag, passed = knob_arguments(given)
    assert flag == knob.flag
    assert _params(sidecar_command, ["--model-name", "m", flag, passed])[knob.attribute] == value
    # Unset knobs are left to the sidecar's own defaults.
    assert knob_arguments(_params(serve_command, ["--handler", "toy"])) == []


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.key)
def test_carpool_batch_takes_each_knob_as_a_keyword(knob: Knob) -> None:
    value = other_value(knob)
    batched = carpool.batch(**{knob.attribute: value})(lambda items: items)
    assert getattr(batched._settings, knob.attribute) == value


def test_carpool_batch_refuses_a_keyword_that_is_no_knob() -> None:
    with pytest.raises(TypeError, match="max_batch_sise"):
        carpool.batch(max_batch_sise=3)


MODEL = {
    "apiVersion": "carpool.dev/v1alpha1",
    "kind": "BatchedModel",
    "metadata": {"name": "plain"},
    "spec": {"model": {"handler": "toy"}},
}


def _rendered_batching(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The batching.json `carpool render` writes for MODEL, which sets no batching."""
    result = CliRunner().invoke(render_command, ["-f", "-", *args], yaml.safe_dump(MODEL), env=env)
    assert result.exit_code == 0, result.output
    (config,) = [m for m in yaml.safe_load_all(result.output) if m["kind"] == "ConfigMap"]
    settings: dict[str, Any] = json.loads(config["data"]["batching.json"])
    return settings


def test_the_operator_takes_every_knob_as_a_default_flag_or_variable() -> None:
    values = {knob: other_value(knob) for knob in KNOBS}
    by_flag = _rendered_batching(
        [f"{default_flag(knob.attribute)}={value}" for knob, value in values.items()], {}
    )
    by_variable = _rendered_batching(
        [], {default_variable(knob.attribute): str(value) for knob, value in values.items()}
    )
    for knob, value in values.items():
        assert by_flag[knob.key] == by_variable[knob.key] == value, knob.key


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.key)
def test_the_crd_and_the_chart_state_each_knob_with_its_bounds(knob: Knob) -> None:
    crd = yaml.safe_load((ROOT / "crds/batchedmodels.carpool.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    crd_knob = spec["properties"]["batching"]["properties"][knob.key]
    values = yaml.safe_load((ROOT / "charts/carpool/values.yaml").read_text())
    assert values["defaults"][knob.key] == knob.default
    schema = json.loads((ROOT / "charts/carpool/values.schema.json").read_text())
    chart_knob = schema["properties"]["defaults"]["properties"][knob.key]
    for stated in (crd_knob, chart_knob):
        if knob.choices:
            assert stated["enum"] == list(knob.choices)
        else:
            assert (stated["minimum"], stated["maximum"]) == (knob.minimum, knob.maximum)
    # And the values accept what the sidecar accepts.
    BatchingSettings(**{knob.attribute: other_value(knob)})


@pytest.mark.skipif(not HELM.exists(), reason="helm is installed by make tools")
def test_the_chart_passes_every_knob_to_the_operator() -> None:
    sets = tuple(f"defaults.{knob.key}={other_value(knob)}" for knob in KNOBS)
    (deployment,) = [m for m in render(sets=sets) if m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    for knob in KNOBS:
        assert env[default_variable(knob.attribute)] == str(other_value(knob))


@pytest.mark.parametrize("document", ["docs/sidecar.md", "docs/operator.md", "docs/library.md"])
def test_the_docs_tables_list_every_knob(document: str) -> None:
    text = (ROOT / document).read_text()
    for knob in KNOBS:
        named = {knob.flag, default_flag(knob.attribute), knob.attribute}
        assert any(f"| `{name}` |" in text for name in named), f"{document} lacks {knob.key}"


def _examples_of_every_setting() -> list[tuple[str, str]]:
    """The docs' code blocks that show a whole set of batching settings (a `batching.json`,
    a `status.batching`): those that name `maxQueueBytes`, which no partial example sets."""
    shown = []
    for document in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"^```[^\n]*\n(.*?)^```$", document.read_text(), re.S | re.M):
            if "maxQueueBytes" in block:
                shown.append((document.name, block))
    return shown


def test_the_docs_examples_of_the_settings_name_every_knob() -> None:
    examples = _examples_of_every_setting()
    assert len(examples) >= 2  # architecture.md's batching.json, operator.md's status
    for document, block in examples:
        missing = [knob.key for knob in KNOBS if knob.key not in block]
        assert not missing, f"an example of the batching settings in {document} lacks {missing}"
