"""The text-generation handler's token loop: continuous batching, streamed, greedy-exact."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from library.test_streamed_text import count_decodes
from library.test_text_generation import prompt_item
from library.tiny_lm import WORDS, after_prompt
from prometheus_client import CollectorRegistry

from carpool.contract import wire
from carpool.contract.wire import Item
from carpool_model_server import streaming
from carpool_model_server.continuous import Piece, stop_tail
from carpool_model_server.errors import DeviceFailed, InvalidItem
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_generation import TextGenerationHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner
from carpool_model_server.service import ModelService
from carpool_model_server.streamed_text import CONTEXT_TOKENS
from carpool_model_server.streaming import GenerationMetrics

# The loop's defaults, and steps of 16 tokens that split most prompts over several steps.
STEPS = [{}, {"step_tokens": "16"}]


@pytest.fixture(scope="module", params=STEPS, ids=["default-steps", "split-prompts"])
def handler(tiny_lm_path: Path, request: pytest.FixtureRequest) -> Iterator[TextGenerationHandler]:
    options = {"batching": "continuous", **request.param}
    settings = HandlerSettings(tiny_lm_path, torch.float32, 16, options)
    loaded = TextGenerationHandler(settings)
    loaded.load(torch.device("cpu"))
    yield loaded
    loaded.close()


def generate_alone(handler: TextGenerationHandler, prompt: str, new_tokens: int) -> tuple[str, int]:
    """The model's own greedy `generate` for one prompt: its answer's text (read after the
    prompt's, as transformers' pipeline reads it) and tokens, up to its end of sequence."""
    ids = handler.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        output = handler.model.generate(
            ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=handler.pad_id
        )
    tokens = [int(token) for token in output[0, ids.shape[1] :]]
    if handler.eos_id in tokens:
        tokens = tokens[: tokens.index(handler.eos_id)]
    return after_prompt(handler.tokenizer, ids[0].tolist(), tokens), len(tokens)


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
    assert handler.metadata.streams_tokens
    requests = mixed(12, seed=3)
    answers = await asyncio.gather(
        *(stream(handler, prompt_item(p, max_new_tokens=n)) for p, n in requests)
    )
    for (prompt, new_tokens), pieces in zip(requests, answers, strict=True):
        final = pieces[-1].answer
        assert final is not None and all(piece.answer is None for piece in pieces[:-1])
        assert "".join(piece.text for piece in pieces) == final.text
        assert (final.text, final.generated_tokens) == generate_alone(handler, prompt, new_tokens)


async def test_a_stream_decodes_each_token_once_not_its_whole_text_each_time(
    handler: TextGenerationHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text so far is decoded token by token: decoding it whole at every token cost
    each step the answer's length, per running sequence. Only the answer is decoded whole,
    after the prompt's last tokens (whose own text is decoded too)."""
    decoded = count_decodes(handler.tokenizer, monkeypatch)
    pieces = await stream(handler, prompt_item("a red house by the river", max_new_tokens=30))
    final = pieces[-1].answer
    assert final is not None and final.generated_tokens == 30 and len(pieces) > 10
    assert sorted(decoded) == [CONTEXT_TOKENS, CONTEXT_TOKENS, CONTEXT_TOKENS + 30]


async def test_newcomers_prompts_are_prefilled_in_steps_of_their_own(
    handler: TextGenerationHandler,
) -> None:
    """Sequences that decode wait out the step that prefills a newcomer's prompt: on a CPU a
    step's attention covers every key its sequences have cached, so a prompt prefilled
    beside them costs many times what it costs alone, and that is the newcomer's wait for
    its first token."""
    assert handler.loop is not None
    scheduler = handler.loop._manager.batch_processor.scheduler
    steps: list[list[tuple[str, bool]]] = []  # (request, whether it gets a token) per step
    schedule = scheduler.schedule_batch

    def recorded(token_budget: int, cache_budget: int) -> Any:
        scheduled = schedule(token_budget, cache_budget)
        if scheduled[0]:
            steps.append([(each.state.request_id, each.has_new_token) for each in scheduled[0]])
        return scheduled

    scheduler.schedule_batch = recorded
    try:
        first = [stream(handler, prompt_item(p, max_new_tokens=30)) for p, _ in mixed(3, 5)]
        running = [asyncio.ensure_future(each) for each in first]
        await asyncio.sleep(0.2)  # they decode
        later = [stream(handler, prompt_item(p, max_new_tokens=5)) for p, _ in mixed(2, 6)]
        await asyncio.gather(*running, *later)
    finally:
        del scheduler.schedule_batch  # the class's own again
    prompted: set[str] = set()  # requests past their prompt
    kinds = []
    for step in steps:
        kinds.append({request in prompted for request, _ in step})
        prompted.update(request for request, new_token in step if new_token)
    assert len(prompted) == 5
    assert all(len(kind) == 1 for kind in kinds), kinds


async def test_of_prompts_waiting_together_the_shortest_gets_its_first_token_first(
    handler: TextGenerationHandler,
) -> None:
    """Prompts that arrived during the same step are prefilled shortest first: a short
    prompt behind a long one gets its first token at the next step, not once the long
    one's prefill (split over steps) is done."""
    assert handler.loop is not None
    manager = handler.loop._manager
    scheduler = manager.batch_processor.scheduler
    entered, gate = threading.Event(), threading.Event()
    firsts: list[list[int]] = []  # per step: the prompt lengths that get their first token
    schedule = scheduler.schedule_batch

    def gated(token_budget: int, cache_budget: int) -> Any:
        entered.set()
        gate.wait(10.0)  # the loop waits here, new requests pile up in its queue
        scheduled = schedule(token_budget, cache_budget)
        if scheduled[0]:
            firsts.append(
                [
                    len(each.state.initial_tokens)
                    for each in scheduled[0]
                    if each.has_new_token and not each.state.generated_tokens
                ]
            )
        return scheduled

    scheduler.schedule_batch = gated
    try:
        blocker = asyncio.ensure_future(stream(handler, prompt_item("a b c d e", 1)))
        assert await asyncio.to_thread(entered.wait, 10.0)
        long_prompt = " ".join(["the", "red", "cat", "sat"] * 10)
        waiting = [
            asyncio.ensure_future(stream(handler, prompt_item(prompt, 1)))
            for prompt in (long_prompt, "small blue dog")
        ]
        for _ in range(200):
            if manager.input_queue.qsize() == 2:
                break
            await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(blocker, *waiting)
    finally:
        gate.set()
        del scheduler.schedule_batch  # the class's own again
    assert firsts[0] == [5]
    assert 3 in firsts[1], firsts
    assert 40 in [length for step in firsts for length in step]


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


async def test_only_a_tail_that_may_begin_a_stop_string_is_held(
    handler: TextGenerationHandler,
) -> None:
    """Stop strings that the text cannot begin leave every piece as it comes without them:
    a word is not split across pieces for a stop string it does not start. (A piece holds
    a word or, for a reader that fell behind the loop, the words it missed.)"""
    prompt = "a red house by the river"
    free = await stream(handler, prompt_item(prompt, max_new_tokens=12))
    held = await stream(handler, prompt_item(prompt, max_new_tokens=12, stop=["!" * 8, "?? sky"]))
    assert all(re.fullmatch(r"( \w+)+", piece.text) for piece in held if piece.text)
    assert "".join(piece.text for piece in held) == "".join(piece.text for piece in free)
    assert held[-1].answer == free[-1].answer


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("blue evening e", ""),
        ("blue evening th", "th"),
        ("blue the s", "the s"),
        ("blue the", "the"),
        ("the sky", ""),  # whole: the stop string itself ends the answer
        ("", ""),
    ],
)
def test_the_held_tail_is_the_longest_that_begins_a_stop_string(text: str, held: str) -> None:
    assert text[len(text) - stop_tail(text, ("the sky", "sun")) :] == held


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


async def test_the_last_tokens_of_closed_streams_are_not_kept(
    handler: TextGenerationHandler,
) -> None:
    """The step running as streams close makes their next tokens all the same: with no
    one to take them, transformers queues them for `get_result`, which nothing calls, so
    every stream a caller left could leave tokens behind for good."""
    assert handler.loop is not None
    manager = handler.loop._manager
    scheduler = manager.batch_processor.scheduler
    entered, gate = threading.Event(), threading.Event()
    schedule = scheduler.schedule_batch

    def gated(token_budget: int, cache_budget: int) -> Any:
        entered.set()
        gate.wait(10.0)  # the step goes on once the streams are closed
        return schedule(token_budget, cache_budget)

    streams = [handler.stream(prompt_item(p, 100)) for p, _ in mixed(4, seed=8)]
    try:
        for pieces in streams:
            assert pieces is not None
            await anext(pieces)
        scheduler.schedule_batch = gated
        assert await asyncio.to_thread(entered.wait, 10.0)
        for pieces in streams:
            assert pieces is not None
            await pieces.aclose()
    finally:
        gate.set()
        del scheduler.schedule_batch  # the class's own again
    await stream(handler, prompt_item("a red house", 3))
    assert manager.output_router.output_queue.qsize() == 0


async def test_time_to_first_token_counts_from_the_frames_arrival(
    handler: TextGenerationHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenizing the prompt is part of a stream's wait for its first token (a long one
    takes a while): the histogram counts from the frame's arrival, as it says."""
    stream_of = handler.stream

    def slow_to_tokenize(item: Item) -> Any:
        time.sleep(0.3)
        return stream_of(item)

    async def unused(body: bytes) -> bytes:
        raise AssertionError("the stream runs as a batch")

    monkeypatch.setattr(handler, "stream", slow_to_tokenize)
    registry = CollectorRegistry()
    metrics = GenerationMetrics.create(registry, "lm", handler.loop_state)
    body = wire.encode_request([prompt_item("a red house", 3)])
    frames = [frame async for frame in streaming.answer(handler, body, unused, metrics)]
    assert frames[-1][0] == 200
    waited = registry.get_sample_value(
        "carpool_model_time_to_first_token_seconds_sum", {"model": "lm"}
    )
    assert waited is not None and waited >= 0.3


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("scheduler=lifo", "use one of ('prefill_alone', 'fifo', 'prefill_first')"),
        ("step_tokens=-1", "whole"),
    ],
)
def test_step_options_are_checked(tiny_lm_path: Path, option: str, message: str) -> None:
    name, value = option.split("=")
    options = {"batching": "continuous", name: value}
    with pytest.raises(ValueError, match=re.escape(message)):
        TextGenerationHandler(HandlerSettings(tiny_lm_path, torch.float32, 16, options))


async def test_a_loop_that_failed_refuses_the_next_requests_at_once(tiny_lm_path: Path) -> None:
    """A step that raises (a device out of memory, logits with NaN to sample from) stops
    transformers' loop for good: the streams in it fail, every later request is refused
    with the loop's error, not dropped to wait forever, and the health probe fails; the
    streams count as failed, not as cancelled by their callers."""
    settings = HandlerSettings(tiny_lm_path, torch.float32, 16, {"batching": "continuous"})
    handler = TextGenerationHandler(settings)
    handler.load(torch.device("cpu"))
    service = ModelService(
        "lm", Runner(handler, torch.device("cpu"), ModelMetrics.create("lm"), 16)
    )
    service.ready = True

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("out of memory")

    async def answer(prompt: str) -> list[tuple[int, bytes]]:
        frames = service.stream_body(wire.encode_request([prompt_item(prompt, 5)]))
        return await asyncio.wait_for(_all(frames), 10.0)

    handler.model.forward = broken
    try:
        with pytest.raises(DeviceFailed, match="out of memory"):
            await answer("a red house")
        assert service.runner.failure is not None
        with pytest.raises(DeviceFailed, match="generation loop stopped"):
            await answer("the blue sky")
        registry = service.runner.metrics.registry
        for outcome, count in (("failed", 2), ("cancelled", 0)):
            labels = {"model": "lm", "outcome": outcome}
            assert registry.get_sample_value("carpool_model_streams_total", labels) == count
    finally:
        handler.close()


async def test_a_sequence_longer_than_the_cache_is_refused(tiny_lm_path: Path) -> None:
    """A cache smaller than the model's context (`cache_tokens`): a request that could not
    fit in it even alone is refused, and the loop serves the next one."""
    options = {"batching": "continuous", "cache_tokens": "64"}
    handler = TextGenerationHandler(HandlerSettings(tiny_lm_path, torch.float32, 4, options))
    handler.load(torch.device("cpu"))
    try:
        with pytest.raises(InvalidItem, match="KV cache of 64 tokens"):
            handler.stream(prompt_item("a red house by the river", 59))
        pieces = await asyncio.wait_for(stream(handler, prompt_item("a red house", 58)), 10.0)
        assert pieces[-1].answer is not None
    finally:
        handler.close()


async def _all(frames: AsyncIterator[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    return [frame async for frame in frames]
