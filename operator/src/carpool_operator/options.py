"""The --default-* options shared by `carpool operator` and `carpool render`.

Each option also reads its CARPOOL_DEFAULT_* variable. Click only collects the text; the
checks live in `defaults.parse_defaults`, whose errors name the flag or the variable the bad
value came from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click
from click.core import ParameterSource

from carpool.contract.batching import KNOBS, Batching
from carpool.contract.pod import default_flag as flag
from carpool.contract.pod import default_variable as variable
from carpool_operator.defaults import (
    DEFAULT_CUDA_IMAGE,
    DEFAULT_IMAGE,
    DEFAULT_SIDECAR_IMAGE,
    NAMES,
    Defaults,
    DefaultsError,
    Setting,
    parse_defaults,
)

_META_KEY = "carpool_operator.defaults"
F = TypeVar("F", bound=Callable[..., object])


def _help(name: str) -> str:
    if name == "image":
        return f"The model image of BatchedModels that name none [default: {DEFAULT_IMAGE}]."
    if name == "cuda_image":
        return (
            f"The model image of GPU BatchedModels that name none [default: {DEFAULT_CUDA_IMAGE}]."
        )
    if name == "runtime_class_name":
        return "The RuntimeClass of GPU pods whose BatchedModel names none [default: none]."
    if name == "sidecar_image":
        return (
            "The sidecar image of BatchedModels that name none; empty: the model image "
            f"[default: {DEFAULT_SIDECAR_IMAGE}]."
        )
    key = next((knob.key for knob in KNOBS if knob.attribute == name), name)
    built_in = getattr(Batching(), name)
    return f"spec.batching.{key} where a BatchedModel leaves it out [default: {built_in}]."


def _collect(context: click.Context, parameter: click.Parameter, value: str | None) -> None:
    if value is None or parameter.name is None:
        return
    from_env = context.get_parameter_source(parameter.name) == ParameterSource.ENVIRONMENT
    source = variable(parameter.name) if from_env else flag(parameter.name)
    context.meta.setdefault(_META_KEY, {})[parameter.name] = Setting(source, value)


def default_options(command: F) -> F:
    """Add every --default-* option to a click command; read them with `defaults_from`."""
    for name in reversed(NAMES):
        option = click.option(
            flag(name),
            name,
            envvar=variable(name),
            default=None,
            metavar="IMAGE" if name.endswith("image") else "VALUE",
            help=_help(name),
            expose_value=False,
            callback=_collect,
        )
        command = option(command)
    return command


def defaults_from(context: click.Context) -> Defaults:
    """The checked defaults of a command decorated with `default_options`."""
    try:
        return parse_defaults(context.meta.get(_META_KEY, {}))
    except DefaultsError as error:
        raise click.UsageError(str(error), context) from error
