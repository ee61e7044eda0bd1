"""A large body is converted off the event loop: health probes and small requests are
answered while it converts, through a real sidecar and toy model server."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from support.sidecar import Sidecar, run_pair

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
