"""The progress bar draws on a terminal and stays out of logs."""

from __future__ import annotations

import io

from carpool.loadgen.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_fills_with_requests_and_ends_with_a_newline() -> None:
    terminal = Terminal()
    progress = Progress("c=8", duration=None, requests=100, stream=terminal)
    progress.update(50)
    progress.close(100)
    lines = terminal.getvalue().split("\r")
    assert "[" + "#" * 15 + "." * 15 + "]" in lines[1]
    assert lines[-1].startswith("c=8 [" + "#" * 30 + "]") and lines[-1].endswith("\n")
    assert "100 requests" in lines[-1]


def test_nothing_is_written_to_a_file_or_when_disabled() -> None:
    log = io.StringIO()
    progress = Progress("c=8", duration=1.0, requests=None, stream=log)
    progress.update(1)
    progress.close(1)
    terminal = Terminal()
    Progress("c=8", duration=1.0, requests=None, stream=terminal, enabled=False).close(1)
    assert log.getvalue() == "" and terminal.getvalue() == ""
