"""The `carpool` commands the README and the docs show, held to the commands themselves.

A user copies these lines: every flag they name must be one the subcommand takes, and the
operator's synopsis in docs/operator.md must name every option `carpool operator` has.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import click
import pytest

from carpool.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SUBCOMMANDS = ("model-server", "sidecar", "serve", "operator", "render", "bench", "tune", "infer")
# `carpool serve ...` or `.venv/bin/carpool serve ...`, not `carpool/src/...`.
COMMAND = re.compile(rf"(?<![\w./-])(?:[\w.-]*/)*carpool ({'|'.join(SUBCOMMANDS)})(?![\w-])(.*)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w*-])")  # `--default-*` names a family


@cache
def options(subcommand: str) -> frozenset[str]:
    command = main.get_command(click.Context(main), subcommand)
    assert command is not None, subcommand
    return frozenset(
        name
        for parameter in command.params
        if isinstance(parameter, click.Option)
        for name in (*parameter.opts, *parameter.secondary_opts)
    )


def code(text: str) -> list[str]:
    """Lines of the fenced blocks (continuations joined) and inline code spans (unwrapped)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```$", text, re.S | re.M)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"^```[^\n]*\n.*?^```$", "", text, flags=re.S | re.M)
    return lines + [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]


def shown_commands() -> list[tuple[str, str, str]]:
    """(document, subcommand, the rest of its line) for every `carpool` command shown."""
    shown = []
    for document in DOCUMENTS:
        for line in code(document.read_text()):
            for match in COMMAND.finditer(line.split(" #")[0]):
                shown.append((document.name, match.group(1), match.group(2)))
    return shown


def test_the_docs_show_commands_of_every_subcommand() -> None:
    assert {subcommand for _, subcommand, _ in shown_commands()} == set(SUBCOMMANDS)


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_every_flag_a_doc_gives_a_subcommand_is_one_it_takes(subcommand: str) -> None:
    unknown = [
        f"{document}: carpool {subcommand} {flag}"
        for document, shown, rest in shown_commands()
        if shown == subcommand
        for flag in FLAG.findall(rest)
        if flag not in options(subcommand)
    ]
    assert not unknown, unknown


def test_the_operator_synopsis_names_every_option() -> None:
    text = (REPO / "docs" / "operator.md").read_text()
    (synopsis,) = [line for line in code(text) if line.startswith("carpool operator [")]
    block = text[text.index(synopsis) :].split("```")[0]
    missing = sorted(options("operator") - set(FLAG.findall(block)) - {"--help"})
    assert not missing, f"docs/operator.md's synopsis of carpool operator lacks {missing}"
