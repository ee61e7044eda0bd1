"""The text-generation handler's token loop: continuous batching, streamed, greedy-exact."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from library.test_text_generation import prompt_item
from library.tiny_lm import WORDS

from carpool.contract.wire import Item
from carpool_model_server.continuous import Piece
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_generation import TextGenerationHandler


@pytest.fixture(scope="module")
def handler(tiny_lm_path: Path) -> Iterator[TextGenerationHandler]:
    settings = HandlerSettings(tiny_lm_path, torch.float32, 16, {"batching": "continuous"})
    loaded = TextGenerationHandler(settings)
    loaded.load(torch.device("cpu"))
    yield loaded
    loaded.close()


def generate_alone(handler: TextGenerationHandler, prompt: str, new_tokens: int) -> list[int]:
    """The model's own greedy `generate` for one prompt: its new tokens."""
    ids = handler.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        output = handler.model.generate(
            ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=handler.pad_id
        )
    return [int(token) for token in output[0, ids.shape[1] :]]


async def stream(handler: TextGenerationHandler, item: Item) -> list[Piece]:
    pieces = handler.stream(item)
    assert pieces is not None
    return [piece async for piece in pieces]


def mixed(count: int, seed: int) -> list[tuple[str, int]]:
    rng = np.random.default_rng(seed)
    return [
        (" ".join(rng.choice(WORDS, size=int(rng.integers(1, 60)))), int(rng.integers(1, 40)))
        for _ in range(count)
    ]


async def test_concurrent_streams_match_generate_alone(handler: TextGenerationHandler) -> None:
    requests = mixed(12, seed=3)
    answers = await asyncio.gather(
        *(stream(handler, prompt_item(p, max_new_tokens=n)) for p, n in requests)
    )
    for (prompt, new_tokens), pieces in zip(requests, answers, strict=True):
        final = pieces[-1].answer
        assert final is not None and all(piece.answer is None for piece in pieces[:-1])
        assert "".join(piece.text for piece in pieces) == final.text
        tokens = generate_alone(handler, prompt, new_tokens)
        if handler.eos_id in tokens:
            tokens = tokens[: tokens.index(handler.eos_id)]
        assert final.text == handler.tokenizer.decode(tokens, skip_special_tokens=True)
        assert final.generated_tokens == len(tokens)


async def test_a_stop_string_ends_the_stream_before_it(handler: TextGenerationHandler) -> None:
    prompt = "a red house by the river"
    free = (await stream(handler, prompt_item(prompt, max_new_tokens=20)))[-1].answer
    assert free is not None
    stop_word = free.text.split()[4]
    pieces = await stream(handler, prompt_item(prompt, max_new_tokens=20, stop=[stop_word]))
    final = pieces[-1].answer
    assert final is not None and final.finish_reason == "stop_sequence"
    assert "".join(piece.text for piece in pieces) == final.text
    assert final.text == free.text[: free.text.index(stop_word)]


async def test_closing_a_stream_frees_its_sequence(handler: TextGenerationHandler) -> None:
    pieces = handler.stream(prompt_item("a red house by the river", max_new_tokens=200))
    assert pieces is not None
    await anext(pieces)
    state = handler.loop_state()
    assert state is not None and state.running == 1 and state.cache_used > 0
    await pieces.aclose()
    for _ in range(100):
        state = handler.loop_state()
        assert state is not None
        if state.running == 0 and state.cache_used == 0:
            break
        await asyncio.sleep(0.02)
    assert (state.running, state.waiting, state.cache_used) == (0, 0, 0)


def test_sampled_items_take_the_static_way(handler: TextGenerationHandler) -> None:
    assert handler.stream(prompt_item("the sky", temperature=0.5)) is None
    assert handler.metadata.streams_tokens
