"""Sampled requests in the token loop: beside greedy ones in one running batch, each drawing
from its own seed, so a seeded request's text does not depend on its company."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from library.test_continuous import generate_alone, mixed, stream
from library.test_text_generation import prompt_item

from carpool.contract.wire import Item
from carpool_model_server import row_choice, sampling
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_generation import Answer, TextGenerationHandler


@pytest.fixture(scope="module")
def handler(token_loop: TextGenerationHandler) -> TextGenerationHandler:
    return token_loop


def sampled(seed: int, new_tokens: int = 30, stop: list[str] | None = None) -> Item:
    # Temperature 2 spreads the tiny model's draws: two seeds soon part ways.
    return prompt_item("the moon", max_new_tokens=new_tokens, temperature=2.0, seed=seed, stop=stop)


async def answer(handler: TextGenerationHandler, item: Item) -> Answer:
    final = (await stream(handler, item))[-1].answer
    assert final is not None
    return final


def static_answer(tiny_lm_path: Path, item: Item) -> Answer:
    """The item's answer through the static way (`model.generate`, one batch of one)."""
    static = TextGenerationHandler(HandlerSettings(tiny_lm_path, torch.float32, 16))
    static.load(torch.device("cpu"))
    with torch.inference_mode():
        prepared = static.preprocess([item])
        assert prepared.batch is not None
        return static.infer(prepared.batch)[0]


def neighbours() -> list[Item]:
    """Seven mixed requests: greedy and sampled, seeded and not, short and long."""
    items = []
    for index, (prompt, new_tokens) in enumerate(mixed(7, seed=21)):
        if index % 2:
            items.append(prompt_item(prompt, max_new_tokens=new_tokens))
        else:
            seed = None if index == 4 else 100 + index
            items.append(prompt_item(prompt, max_new_tokens=new_tokens, temperature=1.0, seed=seed))
    return items


async def test_sampled_and_greedy_requests_decode_in_the_same_steps(
    handler: TextGenerationHandler,
) -> None:
    assert handler.loop is not None
    scheduler = handler.loop._manager.batch_processor.scheduler
    decoding: list[int] = []  # sequences that get a token, per step
    schedule = scheduler.schedule_batch

    def recorded(token_budget: int, cache_budget: int) -> Any:
        scheduled = schedule(token_budget, cache_budget)
        if scheduled[0]:
            decoding.append(sum(each.has_new_token for each in scheduled[0]))
        return scheduled

    scheduler.schedule_batch = recorded
    try:
        items = [sampled(1, 20), prompt_item("a dog ran", max_new_tokens=20), sampled(2, 20)]
        answers = await asyncio.gather(*(answer(handler, item) for item in items))
    finally:
        del scheduler.schedule_batch  # the class's own again
    assert max(decoding) == 3
    assert all(each.generated_tokens > 0 for each in answers)


async def test_a_seeded_request_gets_the_same_text_alone_and_among_seven_others(
    handler: TextGenerationHandler, tiny_lm_path: Path
) -> None:
    alone = await answer(handler, sampled(3))
    assert alone.generated_tokens >= 5  # a draw long enough to tell seeds apart
    # Four neighbours are decoding when it arrives, three come after it.
    others = neighbours()
    early = [asyncio.ensure_future(answer(handler, item)) for item in others[:4]]
    await asyncio.sleep(0.05)
    mine = asyncio.ensure_future(answer(handler, sampled(3)))
    await asyncio.sleep(0.01)
    late = [asyncio.ensure_future(answer(handler, item)) for item in others[4:]]
    await asyncio.gather(*early, *late)
    assert (await mine) == alone
    # The static way draws the same tokens from the same seed.
    assert static_answer(tiny_lm_path, sampled(3)) == alone


async def test_two_seeds_draw_two_texts(handler: TextGenerationHandler) -> None:
    first, second, greedy = await asyncio.gather(
        answer(handler, sampled(3)),
        answer(handler, sampled(1)),
        answer(handler, prompt_item("the moon", max_new_tokens=30)),
    )
    assert len({first.text, second.text, greedy.text}) == 3


async def test_greedy_requests_beside_sampled_ones_match_generate_alone(
    handler: TextGenerationHandler,
) -> None:
    requests = mixed(8, seed=13)
    items = [
        prompt_item(prompt, max_new_tokens=n, temperature=1.5 if index % 2 else None, seed=index)
        for index, (prompt, n) in enumerate(requests)
    ]
    answers = await asyncio.gather(*(answer(handler, item) for item in items))
    for (prompt, new_tokens), final in list(zip(requests, answers, strict=True))[::2]:
        assert final.text == generate_alone(handler, prompt, new_tokens)[0]


async def test_a_sampled_request_keeps_its_stop_strings_and_token_limit(
    handler: TextGenerationHandler,
) -> None:
    free = await answer(handler, sampled(3))
    stop_word = free.text.split()[3]
    cut = await answer(handler, sampled(3, stop=[stop_word]))
    assert cut.finish_reason == "stop_sequence"
    assert cut.text == free.text[: free.text.index(stop_word)]
    short = await answer(handler, sampled(3, new_tokens=2))
    assert (short.finish_reason, short.generated_tokens) == ("length", 2)
    assert free.text.startswith(short.text)


def test_the_running_loop_chooses_with_carpools_token_choice(
    handler: TextGenerationHandler,
) -> None:
    """What `row_choice` relies on in transformers: the loop it starts takes the choice put
    in before, and refuses another once started (checked at every load, here both ways)."""
    from transformers import LogitsProcessorList
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessorList,
    )

    assert handler.loop is not None
    manager = handler.loop._manager
    row_choice.verify(manager, handler.loop._choice)
    other = ContinuousBatchingLogitsProcessorList(LogitsProcessorList())
    with pytest.raises(RuntimeError, match="no longer takes carpool's token choice"):
        row_choice.verify(manager, other)
    with pytest.raises(RuntimeError, match="before it starts"):
        row_choice.install(manager)


async def test_a_batch_sent_whole_gets_its_own_text_while_the_loop_is_busy(
    handler: TextGenerationHandler, tiny_lm_path: Path
) -> None:
    """`/infer` batches run the static way on the worker thread beside the running loop,
    on the same model: its sequences in flight change none of their tokens."""
    items = [prompt_item("the moon", max_new_tokens=30), sampled(3)]

    def whole() -> list[str]:
        with torch.inference_mode():
            prepared = handler.preprocess(items)
            assert prepared.batch is not None
            return [each.text for each in handler.infer(prepared.batch)]

    quiet = await asyncio.to_thread(whole)
    busy = [
        asyncio.ensure_future(answer(handler, prompt_item(prompt, max_new_tokens=200)))
        for prompt, _ in mixed(8, seed=5)
    ]
    await asyncio.sleep(0.1)
    beside_the_loop = await asyncio.to_thread(whole)
    assert not all(each.done() for each in busy)  # the loop was still decoding
    await asyncio.gather(*busy)
    assert beside_the_loop == quiet
    assert quiet[1] == static_answer(tiny_lm_path, sampled(3)).text


def test_a_sampled_row_with_scores_past_float_takes_its_argmax_and_raises_nothing() -> None:
    """Logits that overflowed (a half-precision model) leave a sampled row no distribution
    to draw from: it takes its argmax, as a greedy row does, rather than raise in the
    loop's step, which would stop the loop for every sequence in it."""
    cpu = torch.device("cpu")
    scores = torch.tensor([[0.0, 1.0, 2.0], [float("nan"), 1.0, 0.0], [0.0, float("inf"), 1.0]])
    generators = {row: sampling.generator(7, cpu) for row in range(3)}
    chosen = sampling.choose(scores, torch.tensor([1.0, 1.0, 1.0]), generators)
    drawn = torch.multinomial(scores[0].softmax(-1), 1, generator=sampling.generator(7, cpu))
    assert chosen.flatten().tolist() == [int(drawn), 0, 1]
