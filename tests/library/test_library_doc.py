"""The aiohttp example of docs/library.md, run as written against concurrent clients."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def example_namespace() -> dict[str, Any]:
    first_block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert first_block is not None
    namespace: dict[str, Any] = {"__name__": "library_example"}
    exec(compile(first_block.group(1), str(DOC), "exec"), namespace)
    return namespace


async def test_the_doc_example_batches_concurrent_http_clients() -> None:
    app: web.Application = example_namespace()["make_app"]()
    texts = [f"text number {i}" + "!" * i for i in range(64)]
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:

        async def ask(text: str) -> Any:
            async with session.post(server.make_url("/embed"), json={"text": text}) as reply:
                assert reply.status == 200
                return (await reply.json())["embedding"]

        answers = await asyncio.gather(*(ask(text) for text in texts))
        async with session.get(server.make_url("/metrics")) as reply:
            exposition = await reply.text()
    assert answers == [[float(len(text))] for text in texts]
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.labels.get("model") == "embed"
    }
    assert samples["carpool_batch_size_sum"] == 64
    assert samples["carpool_batch_size_count"] < 64  # clients shared batches
