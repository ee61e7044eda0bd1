"""A click parameter type for a file a command writes once its work is done (a report, a
plot): a folder that is missing or cannot be written in is refused before the work starts,
not after minutes of load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


class ReportPath(click.Path):
    def __init__(self) -> None:
        super().__init__(dir_okay=False, writable=True, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        folder = Path(os.fsdecode(path)).parent
        if not folder.is_dir():
            self.fail(f"{folder} is not a folder", param, ctx)
        if not os.access(folder, os.W_OK | os.X_OK):
            self.fail(f"cannot write in {folder}", param, ctx)
        return path
