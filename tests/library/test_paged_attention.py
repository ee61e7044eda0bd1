"""The token loop's attention over each sequence's own pages: greedy answers as `generate`
gives them alone, whatever shares the step, and static batches on the same model unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from library.test_continuous import generate_alone, mixed, stream
from library.test_text_generation import prompt_item
from library.tiny_lm import build_tiny_lm

from carpool_model_server import paged_attention
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_generation import TextGenerationHandler

# Steps of 16 tokens under FIFO: decoding sequences share steps with chunks of prompts, the
# first chunk of a prompt reading no cache and the later ones reading their own.
MIXED_STEPS = {"batching": "continuous", "scheduler": "fifo", "step_tokens": "16"}


@pytest.fixture(scope="module")
def grouped_lm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), grouped_queries=True)


@pytest.fixture(scope="module", params=["gpt2", "llama-grouped-queries"])
def handler(
    request: pytest.FixtureRequest, tiny_lm_path: Path, grouped_lm_path: Path
) -> Iterator[TextGenerationHandler]:
    path = tiny_lm_path if request.param == "gpt2" else grouped_lm_path
    loaded = TextGenerationHandler(HandlerSettings(path, torch.float32, 16, MIXED_STEPS))
    loaded.load(torch.device("cpu"))
    yield loaded
    loaded.close()


async def test_streams_sharing_steps_match_generate_alone(handler: TextGenerationHandler) -> None:
    assert handler.model.config._attn_implementation == paged_attention.NAME
    requests = mixed(10, seed=5)
    answers = await asyncio.gather(
        *(stream(handler, prompt_item(p, max_new_tokens=n)) for p, n in requests)
    )
    for (prompt, new_tokens), pieces in zip(requests, answers, strict=True):
        final = pieces[-1].answer
        assert final is not None
        assert final.text == generate_alone(handler, prompt, new_tokens)[0]


def test_a_padded_static_batch_is_answered_as_with_sdpa(tiny_lm_path: Path) -> None:
    loaded = TextGenerationHandler(HandlerSettings(tiny_lm_path, torch.float32, 4, {}))
    loaded.load(torch.device("cpu"))
    prompts = ["the cat sat on the mat and ran far away", "a dog", "red sun over the river"]
    loaded.tokenizer.pad_token, loaded.tokenizer.padding_side = loaded.tokenizer.eos_token, "left"
    batch = loaded.tokenizer(prompts, return_tensors="pt", padding=True)

    def generated() -> list[list[int]]:
        with torch.inference_mode():
            output = loaded.model.generate(
                **batch, max_new_tokens=12, do_sample=False, pad_token_id=loaded.pad_id
            )
        return output[:, batch["input_ids"].shape[1] :].tolist()  # type: ignore[no-any-return]

    with_sdpa = generated()
    assert paged_attention.install(loaded.model)
    try:
        assert generated() == with_sdpa
    finally:
        paged_attention.uninstall(loaded.model)
        loaded.close()
