"""Whether the model server is ready, kept current by one polling task the app owns."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from carpool.contract.metadata import ModelMetadata
from carpool.engine.errors import SidecarError
from carpool_sidecar.client import ModelClient

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5


class ModelState:
    """The sidecar's view of its model server: readiness and metadata."""

    def __init__(self) -> None:
        self.ready = False
        self.metadata: ModelMetadata | None = None

    def mark_down(self) -> None:
        """A batch could not reach the model server: stop advertising readiness at once."""
        if self.ready:
            log.warning("model server unreachable; not ready until it answers /readyz")
        self.ready = False

    async def poll(self, client: ModelClient, on_metadata: Callable[[ModelMetadata], None]) -> None:
        """Runs until cancelled: refresh readiness, and metadata whenever it turns ready."""
        while True:
            ready = await client.ready()
            if ready and not self.ready:
                try:
                    self.metadata = await client.metadata()
                except SidecarError as error:
                    log.warning("cannot read model metadata: %s", error.message)
                    ready = False
                else:
                    log.info("model server ready: %s", self.metadata.name)
                    on_metadata(self.metadata)
            elif self.ready and not ready:
                log.warning("model server not ready")
            self.ready = ready
            await asyncio.sleep(POLL_INTERVAL_S)
