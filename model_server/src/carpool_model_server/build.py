"""Assembles a ModelService from a Config: handler, device, metrics, worker."""

from __future__ import annotations

from carpool.contract.wire import Item
from carpool_model_server.config import Config, key_name
from carpool_model_server.device import resolve_device, resolve_dtype
from carpool_model_server.errors import ConfigError
from carpool_model_server.handler import HandlerSettings, load_handler_class
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner
from carpool_model_server.service import ModelService
from carpool_model_server.warmup import zeros_item


def build_service(config: Config) -> ModelService:
    device = resolve_device(config)
    dtype = resolve_dtype(config, device)
    try:
        handler_class = load_handler_class(config.handler)
    except (ImportError, ValueError) as error:
        raise ConfigError(key_name("handler"), config.handler, str(error)) from error
    warmup_item: Item | None = None
    if config.example_shape is not None:
        try:
            warmup_item = zeros_item(handler_class.metadata, config.example_shape)
        except ValueError as error:
            shape = ",".join(map(str, config.example_shape))
            raise ConfigError(key_name("example_shape"), shape, str(error)) from error
    options = dict(config.handler_options)
    try:
        handler = handler_class(
            HandlerSettings(config.model_path, dtype, config.max_batch_size, options)
        )
    except ValueError as error:
        shown = ",".join(f"{key}={value}" for key, value in config.handler_options)
        raise ConfigError(key_name("handler_options"), shown, str(error)) from error
    metrics = ModelMetrics.create(config.model_name)
    runner = Runner(
        handler, device, metrics, config.max_batch_size, warmup_item, pipeline=config.pipeline
    )
    return ModelService(config.model_name, runner)
