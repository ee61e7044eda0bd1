"""Sentences through the sidecar to the real MiniLM text-embedding model (BYTES input)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import orjson
from support.model_server import http_get
from support.sidecar import metric, run_pair

from carpool_sidecar.tensors import length_prefixed

SENTENCES = [
    "A cat sits on the mat.",
    "A kitten is resting on a rug.",
    "Quarterly revenue grew by twelve percent.",
]


async def test_sentences_embed_in_batches_json_and_binary(tmp_path: Path) -> None:
    with run_pair(tmp_path, "text-embedding", model="minilm") as pair:
        sidecar = pair.sidecar
        url = f"{sidecar.url}/v2/models/minilm/infer"
        json_body = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3, 1], "data": SENTENCES}]
        }
        raw = length_prefixed([s.encode() for s in SENTENCES])
        header = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "text",
                        "datatype": "BYTES",
                        "shape": [3, 1],
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "parameters": {"binary_data_output": True},
            }
        )
        binary_headers = {"Inference-Header-Content-Length": str(len(header))}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=json_body) as reply:
                assert reply.status == 200, await reply.text()
                [output] = (await reply.json())["outputs"]
            async with http.post(url, data=header + raw, headers=binary_headers) as reply:
                body = await reply.read()
                assert reply.status == 200, body
                length = int(reply.headers["Inference-Header-Content-Length"])
            kserve = {"instances": SENTENCES}
            predicts = [
                http.post(f"{sidecar.url}/v1/models/minilm:predict", json=kserve) for _ in range(8)
            ]
            predictions = []
            for reply in await asyncio.gather(*predicts):
                assert reply.status == 200
                predictions.append((await reply.json())["predictions"])
                reply.release()
        assert output["shape"] == [3, 384]
        vectors = np.array(output["data"], dtype=np.float32).reshape(3, 384)
        binary = np.frombuffer(body[length:], "<f4").reshape(3, 384)
        assert np.allclose(vectors, binary, atol=1e-5)
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        cat_kitten, cat_revenue = unit[0] @ unit[1], unit[0] @ unit[2]
        assert cat_kitten > cat_revenue + 0.2
        # v1 answers the same vectors, whatever the batch each sentence landed in.
        for prediction in predictions:
            assert np.allclose(np.array(prediction, dtype=np.float32), vectors, atol=1e-4)
        # Text is bucketed by length, and its padding measured: sentences of 22 to 41 bytes
        # pad by at most 41 / 22 - 1 each.
        count = metric(sidecar, "carpool_batch_padding_ratio_count")
        total = metric(sidecar, "carpool_batch_padding_ratio_sum")
        assert count >= 1 and 0 < total / count <= 41 / 22 - 1
        status, metadata = http_get(pair.model_server, "/metadata")
        assert status == 200 and orjson.loads(metadata)["pads_variable_dims"] is True
