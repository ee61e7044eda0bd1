"""A large body is converted off the event loop, one at a time: health probes and small
requests are answered while it converts (through a real sidecar and toy model server), and
bodies waiting to be converted stay in the reading budget."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from support.sidecar import Sidecar, run_pair

from carpool.engine.errors import Unavailable
from carpool_sidecar.converting import INLINE_BYTES, Converter
from carpool_sidecar.reading import ReadingBudget

# Wall-clock bounds: measured alone, not beside other tests.
pytestmark = pytest.mark.serial

ELEMENTS = 4_000_000  # empty BYTES elements: 16 MB, seconds of conversion


def bytes_body(elements: int) -> tuple[bytes, int]:
    raw = struct.pack("<I", 0) * elements
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "BYTES",
                    "shape": [1, elements],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return header + raw, len(header)


async def probe_while(sidecar: Sidecar, busy: asyncio.Task[float]) -> list[float]:
    """Seconds each /v2/health/live took, asked every 20 ms until `busy` is done."""
    seconds = []
    async with aiohttp.ClientSession() as http:
        while not busy.done():
            started = time.monotonic()
            async with http.get(f"{sidecar.url}/v2/health/live") as reply:
                assert reply.status == 200
            seconds.append(time.monotonic() - started)
            await asyncio.sleep(0.02)
    return seconds


async def test_a_body_that_takes_seconds_to_convert_blocks_no_probe(tmp_path: Path) -> None:
    body, header_length = bytes_body(ELEMENTS)
    with run_pair(tmp_path, "toy", "--max-body-bytes", str(len(body))) as pair:
        sidecar = pair.sidecar

        async def send_big() -> float:
            started = time.monotonic()
            headers = {"Inference-Header-Content-Length": str(header_length)}
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    f"{sidecar.url}/v2/models/toy/infer", data=body, headers=headers
                ) as reply,
            ):
                # Its data fits its shape; the toy model takes FP32, which shows only once
                # the body is converted.
                assert reply.status == 400, await reply.text()
            return time.monotonic() - started

        big = asyncio.create_task(send_big())
        await asyncio.sleep(0.05)
        probes = await probe_while(sidecar, big)
        took = await big
    assert took > 1.0, f"converting took {took:.2f} s: too little to tell"
    assert max(probes) < 0.25, (
        f"probes took up to {max(probes):.2f} s while converting ({took:.2f} s)"
    )


async def test_bodies_waiting_for_the_worker_count_in_the_reading_budget() -> None:
    """Bodies read whole wait for the one worker: they hold their bytes in the budget until
    converted, and past it a body is refused (503) rather than left waiting in memory."""
    budget = ReadingBudget(max_bytes=2 * INLINE_BYTES)
    converter = Converter(budget)
    release = threading.Event()
    size = INLINE_BYTES + 1
    try:
        first = asyncio.create_task(converter.run(size, release.wait))
        second = asyncio.create_task(converter.run(size, lambda: True))
        await asyncio.sleep(0.1)
        assert budget.held == 2 * size
        with pytest.raises(Unavailable) as refused:
            await converter.run(size, lambda: True)
        assert refused.value.headers == {"Retry-After": "1"}
        release.set()
        assert await first and await second
        assert budget.held == 0
    finally:
        release.set()
        converter.close()
