"""Live reload of the batching settings file (a ConfigMap volume in a pod).

Kubelet updates a ConfigMap volume by swapping a symlink, which file-change notification
can miss; polling the content every second cannot.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from carpool.engine.batcher import Batcher
from carpool.engine.settings import BatchingSettings, ConfigError, apply_file

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


class SettingsFile:
    """Lays the file's settings over `base` (flags and environment) whenever it changes."""

    def __init__(self, path: Path, base: BatchingSettings, batcher: Batcher[Any, Any]) -> None:
        self._path = path
        self._base = base
        self._batcher = batcher
        self._content: bytes | None = None

    def load(self, content: bytes | None) -> None:
        """Apply new content; a bad file is logged and the settings in use are kept."""
        if content is None or content == self._content:
            return
        self._content = content
        try:
            settings = apply_file(self._base, content)
        except ConfigError as error:
            log.error("ignoring settings file %s: %s", self._path, error)
            return
        if settings != self._batcher.settings:
            log.info("batching settings from %s: %s", self._path, settings)
            self._batcher.update(settings)

    def read(self) -> bytes | None:
        try:
            return self._path.read_bytes()
        except OSError as error:
            if self._content is not None:
                log.warning("cannot read settings file %s: %s", self._path, error)
            return None

    async def watch(self) -> None:
        """Runs until cancelled."""
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            self.load(await asyncio.to_thread(self.read))
