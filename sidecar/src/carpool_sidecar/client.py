"""The sidecar's client for its model server, over a UDS (`unix://`) or TCP (`http://`).

Probes and metadata are HTTP. Batches take the framed stream beside a `unix://` socket
(frame_client.py) and `POST /batch` over `http://`. Every failure to get a well-formed
answer becomes a SidecarError: the batch's callers get 503 at once, and the next batch
opens a new connection.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import aiohttp
import orjson

from carpool.contract import frames, wire
from carpool.contract.metadata import MetadataError, ModelMetadata
from carpool.engine.errors import BadModelResponse, ModelUnreachable, Unavailable
from carpool_sidecar.frame_client import FramedBatches

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


class ModelClient:
    def __init__(self, url: str, framed: bool = True) -> None:
        """`framed` False sends batches as `POST /batch` over a socket too (bench/hop.py)."""
        connector: aiohttp.BaseConnector
        self._frames: FramedBatches | None = None
        if url.startswith("unix://"):
            path = url.removeprefix("unix://")
            connector = aiohttp.UnixConnector(path=path)
            self._base = "http://model-server"
            if framed:
                self._frames = FramedBatches(frames.socket_for(path))
        else:
            connector = aiohttp.TCPConnector()
            self._base = url.rstrip("/")
        self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self._frames is not None:
            await self._frames.close()
        await self._session.close()

    async def ready(self) -> bool:
        try:
            async with self._session.get(f"{self._base}/readyz", timeout=PROBE_TIMEOUT) as reply:
                return reply.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def metadata(self) -> ModelMetadata:
        document = await self._get_json("/metadata")
        try:
            return ModelMetadata.decode(document)
        except MetadataError as error:
            raise BadModelResponse(str(error)) from error

    async def _get_json(self, path: str) -> Any:
        try:
            async with self._session.get(f"{self._base}{path}", timeout=PROBE_TIMEOUT) as reply:
                body = await reply.read()
                if reply.status != 200:
                    raise Unavailable(f"model server answered {path} with {reply.status}")
        except (aiohttp.ClientError, TimeoutError) as error:
            raise Unavailable(f"model server unreachable: {error!r}") from error
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise BadModelResponse(f"model server sent invalid JSON for {path}") from error

    async def infer(
        self, items: Sequence[wire.Item], timeout_s: float
    ) -> tuple[list[wire.ItemResult], wire.BatchTiming | None]:
        """One batch round trip: one result per item, in order, and the model server's timing."""
        body = wire.encode_request(items)
        if self._frames is not None:
            payload = await self._frames.send(body, timeout_s)
        else:
            payload = await self._post(body, timeout_s)
        try:
            return wire.decode_answer(payload)
        except wire.WireError as error:
            raise BadModelResponse(
                f"model server sent a malformed batch answer: {error}"
            ) from error

    async def stream(
        self, item: wire.Item, part_limit: int, arrived: Callable[[int], None] | None = None
    ) -> AsyncGenerator[tuple[bool, wire.ItemResult], None]:
        """One item sent as a stream: its results as they come, (True, piece) for each
        piece and (False, whole answer) last, each frame's size told to `arrived` as it
        comes. Only over the framed socket, which a model server that streams tokens
        serves; the caller bounds the time it waits."""
        if self._frames is None:
            raise Unavailable("streams take the framed socket: the model server is not on one")
        answers = self._frames.stream(wire.encode_request([item]), part_limit, arrived)
        try:
            async for code, payload in answers:
                try:
                    (result,) = wire.decode_response(payload)
                except (wire.WireError, ValueError) as error:
                    raise BadModelResponse(
                        f"model server sent a malformed stream answer: {error}"
                    ) from error
                yield code == frames.PART, result
        finally:
            await answers.aclose()

    async def _post(self, body: bytes, timeout_s: float) -> bytes:
        try:
            async with self._session.post(
                f"{self._base}/batch",
                data=body,
                headers={"Content-Type": wire.CONTENT_TYPE},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as reply:
                payload = await reply.read()
                if reply.status != 200:
                    detail = payload[:300].decode(errors="replace")
                    raise Unavailable(f"model server answered {reply.status}: {detail}")
        except TimeoutError as error:
            raise Unavailable(f"model server did not answer within {timeout_s:.3f} s") from error
        except aiohttp.ClientError as error:
            raise ModelUnreachable(f"model server unreachable: {error!r}") from error
        return payload
