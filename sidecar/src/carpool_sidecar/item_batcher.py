"""What the data plane needs of a batcher: the engine itself, or a front process's way to it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from carpool.contract.wire import Item, ItemResult
from carpool.engine.bounds import RequestBounds
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings


class ItemBatcher(Protocol):
    """`carpool.engine.batcher.Batcher[Item, ItemResult]`, as the data plane uses it."""

    @property
    def settings(self) -> BatchingSettings: ...

    @property
    def bounds(self) -> RequestBounds: ...

    @property
    def draining(self) -> bool: ...

    async def submit(
        self,
        items: Sequence[Item],
        key: BatchKey,
        deadline: float,
        *,
        priority: int = 0,
        lengths: Sequence[int] | None = None,
        nbytes: int = 0,
        arrived_at: float | None = None,
    ) -> list[ItemResult]: ...
