"""Generate requests through `--front-processes 2` count in the generation metrics as
through one process (the tiny GPT-2, batched whole)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from support.sidecar import metric, run_pair

MODEL = "gen"


async def test_generate_answers_through_fronts_count_their_tokens(
    tmp_path: Path, tiny_lm_path: Path
) -> None:
    model_args = ["--model-path", str(tiny_lm_path), "--device", "cpu", "--warmup-sizes", "1"]
    args = ("--front-processes", "2")
    with run_pair(tmp_path, "text-generation", *args, model_args=model_args, model=MODEL) as pair:
        sidecar = pair.sidecar
        body = {"text_input": "hello", "parameters": {"max_new_tokens": 5}}
        async with aiohttp.ClientSession() as http:
            for route in ("generate", "generate_stream"):
                url = f"{sidecar.url}/v2/models/{MODEL}/{route}"
                async with http.post(url, json=body) as reply:
                    assert reply.status == 200, await reply.text()
        assert metric(sidecar, "carpool_generation_tokens_total") == 10
        assert metric(sidecar, "carpool_generation_time_to_first_token_seconds_count") == 2
