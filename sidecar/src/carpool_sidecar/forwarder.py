"""The engine's way to the model server: the `BatchSender` the sidecar runs with."""

from __future__ import annotations

from collections.abc import Sequence

from carpool.contract.wire import Item, ItemResult
from carpool.engine.batcher import Batcher
from carpool.engine.errors import ModelUnreachable
from carpool.engine.execution import Answer
from carpool_sidecar.client import ModelClient
from carpool_sidecar.health import ModelState

# The sidecar's engine: model inputs in, the model server's answers out.
ModelBatcher = Batcher[Item, ItemResult]


class ModelServerForwarder:
    """Sends each batch with the model client; a batch that cannot connect marks the model
    server down. A slow or failing batch does not: the model server is still there for the
    next one."""

    def __init__(self, client: ModelClient, state: ModelState) -> None:
        self._client = client
        self._state = state

    async def send(self, items: Sequence[Item], timeout_s: float) -> Answer[ItemResult]:
        try:
            return await self._client.infer(items, timeout_s)
        except ModelUnreachable:
            self._state.mark_down()
            raise
