"""Start `carpool serve` for a test, as a user runs it, and wait for a line of its log.

    with serving("--handler", "toy", "--port", str(port), until="ready at") as process:
        ...                                   # process.stderr: the rest of its log

The process runs from the repository root with the given extra environment; whatever the
test leaves running is killed on the way out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def serving(
    *args: str, until: str, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    command = [sys.executable, "-m", "carpool", "serve", *args]
    environment = {**os.environ, **(env or {})}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if until in line:
                break
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
