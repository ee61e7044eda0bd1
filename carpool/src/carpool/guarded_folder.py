"""A temporary folder that is removed even when its owner is killed by SIGKILL.

`guarded_folder()` creates the folder and starts a small guard process (this module run as
a script) whose stdin is the read end of a pipe; only the owner holds the write end. When
the owner exits, however it exits, the kernel closes that end, the guard reads end of file
and removes the folder. The guard runs in its own session, so a terminal's Ctrl-C does not
reach it before its owner has finished.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from carpool import processes

GUARD_EXIT_TIMEOUT_S = 5.0


@contextmanager
def guarded_folder(prefix: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    read_end, write_end = os.pipe()  # neither end is inherited by other children
    try:
        guard = processes.spawn(
            [sys.executable, "-m", "carpool.guarded_folder", str(folder)],
            stdin=read_end,
            start_new_session=True,
        )
    finally:
        os.close(read_end)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(write_end)
        guard.wait(GUARD_EXIT_TIMEOUT_S)


def _guard(folder: str) -> None:
    # Nothing is ever written: read returns only at end of file, when the owner is gone.
    while sys.stdin.buffer.read(1):
        pass
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    _guard(sys.argv[1])
