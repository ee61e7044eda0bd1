"""A click parameter type for comma-separated lists, such as `--concurrency 1,8,32`."""

from __future__ import annotations

from typing import Any, TypeVar

import click

T = TypeVar("T")


class CommaList(click.ParamType[tuple[T, ...]]):
    """A tuple of `item` values; each part is converted, and its errors named, by `item`.

    Empty parts are skipped ("1,2," is two items). `none_word` (e.g. "none") stands for the
    empty tuple; without it an empty list is refused.
    """

    def __init__(self, item: click.ParamType[T], none_word: str | None = None) -> None:
        self.item = item
        self.none_word = none_word
        self.name = f"{item.name}[,{item.name}...]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[T, ...]:
        if isinstance(value, tuple):
            return value  # a default given already converted
        text = str(value).strip()
        if self.none_word is not None and text.lower() == self.none_word:
            return ()
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts:
            hint = f", or {self.none_word}" if self.none_word else ""
            self.fail(f"{value!r} names no {self.item.name}{hint}", param, ctx)
        return tuple(self.item.convert(part, param, ctx) for part in parts)


class KeyValue(click.ParamType[tuple[str, str]]):
    """One `key=value` part of a CommaList, such as `--handler-options preset=fast,jitter=0.1`."""

    name = "key=value"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        key, equals, text = str(value).partition("=")
        if not (equals and key.strip()):
            self.fail(f"{value!r} is not key=value", param, ctx)
        return key.strip(), text.strip()
