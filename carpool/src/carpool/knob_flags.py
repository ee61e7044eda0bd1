"""The batching knobs as command-line flags, derived from the contract's table.

`carpool sidecar` takes each knob as a flag with its `CARPOOL_*` variable and default;
`carpool serve` takes the same flags, unset unless given, and hands those given to its
sidecar. Both come from `KNOBS`, so a new knob is a flag of both without a line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from carpool.contract.batching import KNOBS, Batching, Knob

F = TypeVar("F", bound=Callable[..., Any])


def _type(knob: Knob) -> Any:
    return click.Choice(knob.choices) if knob.choices else knob.kind


def knob_options(defaults: Batching | None) -> Callable[[F], F]:
    """One option per knob: with `defaults`, each with its default and variable (the
    sidecar); without, unset unless given (a command that passes them on)."""

    def decorate(function: F) -> F:
        for knob in reversed(KNOBS):
            if defaults is None:
                option = click.option(knob.flag, type=_type(knob), help=f"{knob.summary}")
            else:
                option = click.option(
                    knob.flag,
                    type=_type(knob),
                    default=getattr(defaults, knob.attribute),
                    envvar=knob.variable,
                    show_default=True,
                    help=f"{knob.summary} [{knob.variable}]",
                )
            function = option(function)
        return function

    return decorate


def knob_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs among click's parameters, by attribute, those left unset left out."""
    return {
        knob.attribute: options[knob.attribute]
        for knob in KNOBS
        if options.get(knob.attribute) is not None
    }


def knob_arguments(options: Mapping[str, Any]) -> list[str]:
    """`--flag value` for each knob given, to hand on to a sidecar."""
    by_attribute = {knob.attribute: knob for knob in KNOBS}
    return [
        part
        for attribute, value in knob_values(options).items()
        for part in (by_attribute[attribute].flag, str(value))
    ]
