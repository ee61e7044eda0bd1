"""`carpool bench`'s list options: comma-separated, each part converted and bounded."""

from __future__ import annotations

import click
import pytest

from carpool.loadgen.main import command


def params(*args: str) -> dict[str, object]:
    with command.make_context("bench", list(args)) as context:
        return context.params


def test_lists_are_split_on_commas_and_empty_parts_skipped() -> None:
    assert params("--concurrency", "1, 8,,32")["concurrency"] == (1, 8, 32)
    assert params("--rate", "0.5,200")["rate"] == (0.5, 200.0)
    assert params("--input-shape", "3,224,224")["input_shape"] == (3, 224, 224)
    assert params()["input_shape"] == (4,)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--concurrency", "0,8"), "'--concurrency'"),
        (("--concurrency", "eight"), "'eight' is not a valid integer"),
        (("--rate", "-1"), "'--rate'"),
        (("--input-shape", ","), "names no"),
    ],
)
def test_bad_lists_are_refused_naming_the_option(args: tuple[str, ...], words: str) -> None:
    with pytest.raises(click.BadParameter) as raised:
        params(*args)
    assert words in raised.value.format_message()
