"""Settings are validated once, and every error names the key and the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import click
import pytest
import torch

from carpool_model_server import config
from carpool_model_server.build import build_service
from carpool_model_server.config import Config
from carpool_model_server.errors import ConfigError
from carpool_model_server.main import command

BASE = ("--handler", "toy", "--socket", "/tmp/carpool-test.sock")


def parse(*args: str) -> Config:
    """The Config `carpool model-server ARGS` would serve (environment included)."""
    with command.make_context("model-server", list(args)) as context:
        return config.parse(cast(config.Options, context.params))


def test_defaults() -> None:
    settings = parse(*BASE)
    assert (settings.model_name, settings.device, settings.dtype) == ("toy", "auto", "fp32")
    assert settings.max_batch_size == 64
    # Unset: the device decides (every size on a GPU, powers of two on a CPU), in 300 s.
    assert (settings.warmup_sizes, settings.warmup_seconds) == (None, 300)
    assert settings.socket == Path("/tmp/carpool-test.sock") and settings.port is None


def test_warmup_sizes() -> None:
    assert parse(*BASE, "--warmup-sizes", "4,1,4").warmup_sizes == (1, 4)
    assert parse(*BASE, "--warmup-sizes", "none").warmup_sizes == ()
    assert parse(*BASE, "--warmup-sizes", "None").warmup_sizes == ()


def test_empty_environment_variables_mean_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty environment variable counts as unset; only "none" turns warm-up off.
    monkeypatch.setenv("CARPOOL_MODEL_WARMUP_SIZES", "")
    monkeypatch.setenv("CARPOOL_MODEL_MAX_BATCH_SIZE", "")
    assert parse(*BASE).warmup_sizes is None


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARPOOL_MODEL_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("CARPOOL_MODEL_EXAMPLE_SHAPE", "3,224,224")
    settings = parse(*BASE)
    assert settings.max_batch_size == 8 and settings.example_shape == (3, 224, 224)


def test_every_flag_is_also_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/model-server.md: each flag is also CARPOOL_MODEL_<FLAG>, shown in --help."""
    options = [param for param in command.params if param.name != "help"]
    for option in options:
        assert isinstance(option, click.Option) and option.name is not None
        variable = "CARPOOL_MODEL_" + option.name.upper()
        assert (option.envvar, option.show_envvar) == (variable, True), option.opts
    # The two flags outside the Config, as a pod's environment would set them.
    monkeypatch.setenv("CARPOOL_MODEL_TERMINATION_LOG", "/tmp/carpool-test-termination")
    monkeypatch.setenv("CARPOOL_MODEL_REQUIRE_GPU", "1")
    with command.make_context("model-server", list(BASE)) as context:
        assert context.params["termination_log"] == Path("/tmp/carpool-test-termination")
        assert context.params["require_gpu"] is True


def test_example_shape() -> None:
    assert parse(*BASE).example_shape is None
    assert parse(*BASE, "--example-shape", "3,224,224").example_shape == (3, 224, 224)


@pytest.mark.parametrize(
    ("args", "key", "value"),
    [
        (("--dtype", "fp8"), "--dtype", "'fp8'"),
        (("--max-batch-size", "0"), "CARPOOL_MODEL_MAX_BATCH_SIZE", "0"),
        (("--torch-threads", "many"), "--torch-threads", "'many'"),
        (("--warmup-sizes", ","), "--warmup-sizes", "','"),
        (("--example-shape", "3x224"), "--example-shape", "'3x224'"),
        (("--example-shape", "3,0"), "--example-shape", "0"),
    ],
)
def test_bad_values_are_refused_naming_flag_and_value(
    args: tuple[str, ...], key: str, value: str
) -> None:
    with pytest.raises(click.BadParameter) as raised:
        parse(*BASE, *args)
    message = raised.value.format_message()
    assert key in message and value in message


@pytest.mark.parametrize(
    ("args", "key", "value"),
    [
        (("--socket", "/tmp/carpool-test.sock"), "--handler", "None"),
        (("--handler", "toy", "--socket", "/tmp/s", "--device", "gpu"), "--device", "'gpu'"),
        ((*BASE, "--warmup-sizes", "1,128"), "--warmup-sizes", "'1,128'"),
        ((*BASE, "--port", "8080"), "--socket", "carpool-test.sock"),
        (("--handler", "toy"), "--socket", "None"),
        (("--handler", "torchscript", "--port", "1"), "--model-path", "None"),
        (("--handler", "image-classification", "--port", "1"), "--model-path", "None"),
    ],
)
def test_inconsistent_settings_name_key_and_value(
    args: tuple[str, ...], key: str, value: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse(*args)
    assert key in str(raised.value) and value in str(raised.value)


def test_a_path_in_an_error_reads_as_it_was_given() -> None:
    with pytest.raises(ConfigError) as raised:
        parse(*BASE, "--port", "8080")
    given = "(CARPOOL_MODEL_SOCKET) '/tmp/carpool-test.sock': give exactly one data listener"
    assert given in str(raised.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--dtype", "fp16", "--device", "cpu"), "fp16 needs a CUDA device"),
        (("--handler", "no_such_module:Handler"), "no_such_module"),
        (("--handler", "resnet"), "unknown handler 'resnet'"),
        (("--handler", "carpool_model_server.config:Config"), "not a carpool Handler"),
        (("--handler", "text-embedding", "--example-shape", "8"), "example-shape.*BYTES"),
    ],
)
def test_unusable_settings_are_refused_before_serving(args: tuple[str, ...], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        build_service(parse(*BASE, *args))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_device_is_cpu_without_cuda() -> None:
    assert build_service(parse(*BASE)).runner.device == torch.device("cpu")
