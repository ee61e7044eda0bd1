"""Settings are validated once, and every error names the key and the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from carpool.model_server.build import build_service
from carpool.model_server.config import parse
from carpool.model_server.errors import ConfigError

BASE = {"handler": "toy", "socket": "/tmp/carpool-test.sock"}


def test_defaults() -> None:
    config = parse(BASE)
    assert (config.model_name, config.device, config.dtype) == ("toy", "auto", "fp32")
    assert config.max_batch_size == 64
    assert config.warmup_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert config.socket == Path("/tmp/carpool-test.sock") and config.port is None


def test_warmup_sizes_reach_the_max_batch_size() -> None:
    assert parse({**BASE, "max_batch_size": "12"}).warmup_sizes == (1, 2, 4, 8, 12)
    assert parse({**BASE, "warmup_sizes": "4,1,4"}).warmup_sizes == (1, 4)
    assert parse({**BASE, "warmup_sizes": "none"}).warmup_sizes == ()
    assert parse({**BASE, "warmup_sizes": "None"}).warmup_sizes == ()


def test_empty_warmup_sizes_mean_the_default_as_for_every_option() -> None:
    # An empty environment variable counts as unset; only "none" turns warm-up off.
    assert parse({**BASE, "warmup_sizes": ""}).warmup_sizes == parse(BASE).warmup_sizes


def test_example_shape() -> None:
    assert parse(BASE).example_shape is None
    assert parse({**BASE, "example_shape": "3,224,224"}).example_shape == (3, 224, 224)


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        ({"handler": None}, "--handler", "None"),
        ({"dtype": "fp8"}, "--dtype", "'fp8'"),
        ({"device": "gpu"}, "--device", "'gpu'"),
        ({"max_batch_size": "0"}, "CARPOOL_MODEL_MAX_BATCH_SIZE", "'0'"),
        ({"torch_threads": "many"}, "--torch-threads", "'many'"),
        ({"warmup_sizes": "1,128"}, "--warmup-sizes", "'1,128'"),
        ({"warmup_sizes": ","}, "--warmup-sizes", "','"),
        ({"example_shape": "3x224"}, "--example-shape", "'3x224'"),
        ({"example_shape": "3,0"}, "CARPOOL_MODEL_EXAMPLE_SHAPE", "'3,0'"),
        ({"port": "8080"}, "--socket", "carpool-test.sock"),
        ({"socket": None}, "--socket", "None"),
        ({"handler": "torchscript"}, "--model-path", "None"),
    ],
)
def test_errors_name_key_and_value(overrides: dict[str, str | None], key: str, value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse({**BASE, **overrides})
    assert key in str(raised.value) and value in str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"dtype": "fp16", "device": "cpu"}, "fp16 needs a CUDA device"),
        ({"handler": "no_such_module:Handler"}, "no_such_module"),
        ({"handler": "resnet"}, "unknown handler 'resnet'"),
        ({"handler": "carpool.model_server.config:Config"}, "not a carpool Handler"),
        ({"handler": "text-embedding", "example_shape": "8"}, "example-shape.*BYTES"),
    ],
)
def test_unusable_settings_are_refused_before_serving(
    overrides: dict[str, str], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        build_service(parse({**BASE, **overrides}))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_device_is_cpu_without_cuda() -> None:
    assert build_service(parse(BASE)).runner.device == torch.device("cpu")
