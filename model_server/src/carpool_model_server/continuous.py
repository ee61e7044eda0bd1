"""Iteration-level (continuous) batching of text generation, on transformers' own
`ContinuousBatchingManager` with its paged KV cache.

The manager runs the model on a thread of its own: at every decoding step sequences join
(their prompt is prefilled in the same step) and leave (their pages freed), so a request
that wants 5 tokens never waits for a neighbour that wants 500, and one that arrives while
others decode starts at the next step. Each request's tokens come back as they are made (a
reader that fell behind takes those it missed at once: one output waits, `Latest`);
`TokenLoop.generate` turns them into text pieces whose concatenation is the whole answer,
applies the request's stop strings (a piece never shows text a stop string may still cut)
and ends the sequence early when its caller goes away.

Greedy and sampled requests share the running batch (`row_choice`): a greedy request gets
exactly the tokens `model.generate` gives it alone, a sampled one draws at its own
temperature from its own generator, so with a seed it gets the same tokens whatever runs
beside it and whenever it arrives, the tokens the static way draws for that seed.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from carpool.contract import generation
from carpool_model_server import row_choice
from carpool_model_server.errors import DeviceFailed
from carpool_model_server.handler_text_generation import Answer, Request, cut_at_stop, finish
from carpool_model_server.latest import Latest
from carpool_model_server.streamed_text import StreamedText

log = logging.getLogger(__name__)
# Tokens per page of the paged KV cache.
PAGE_TOKENS = 32
# Query tokens of one step, by default: a burst of new prompts is prefilled a few at a time,
# so the first of them start decoding early, and a step's attention stays small where it is
# transformers' own (all its queries over all its keys: see paged_attention.py). Measured in
# benchmarks.md.
STEP_TOKENS = 512
WARMUP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Piece:
    """Text a stream answers at once; the last piece carries the whole answer too."""

    text: str
    answer: Answer | None = None


@dataclass(frozen=True, slots=True)
class StepSettings:
    """What one step of the loop may hold, as transformers' continuous batching takes it."""

    # Query tokens per step (prefill chunks and decodes together); 0: STEP_TOKENS.
    batch_tokens: int
    # What a step holds: "prefill_alone" (new prompts in steps of their own, see
    # prefill_alone.py), or transformers' "fifo" (sequences decoding, then prompts being
    # prefilled, then new ones) or "prefill_first" (prompts split over steps first).
    scheduler: str


@dataclass(frozen=True, slots=True)
class LoopState:
    """What the loop holds now, for the metrics."""

    running: int  # sequences in the running batch
    waiting: int  # sequences queued for a place in it
    cache_used: float  # fraction of the KV cache's pages in use


def one_forward_at_a_time(model: Any) -> None:
    """Make the model's forward passes take turns across threads.

    The loop's steps run on the manager's thread while batches sent whole (`/infer`) run
    the static way on the worker thread, on the same model. transformers' forward sets
    `config.is_causal` for the call's duration (the loop's steps pass False: their mask is
    their own) and then puts it back: a static forward beside a step read False, attended
    both ways, and could leave the flag stuck at False for every later static batch.
    """
    forward, turn = model.forward, threading.RLock()

    @functools.wraps(forward)
    def taking_turns(*args: Any, **kwargs: Any) -> Any:
        with turn:
            return forward(*args, **kwargs)

    model.forward = taking_turns


class TokenLoop:
    """One manager for a loaded causal LM: `generate` streams one request's answer."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        eos_ids: list[int],
        pad_id: int,
        max_sequences: int,
        cache_tokens: int,
        step: StepSettings,
    ) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        from carpool_model_server import paged_attention, prefill_alone

        prefill_alone.register()

        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            do_sample=False, eos_token_id=eos_ids or None, pad_token_id=pad_id, max_new_tokens=1
        )
        # Sized here, not from the free memory of the device (its default): on CPU that
        # takes a share of the whole host's memory and tens of seconds to set up.
        sizes = ContinuousBatchingConfig(
            num_blocks=max(1, cache_tokens // PAGE_TOKENS),
            page_size=PAGE_TOKENS,
            max_batch_tokens=step.batch_tokens or STEP_TOKENS,
            max_requests_per_batch=max_sequences,
            scheduler_type=step.scheduler,
            # Pages of finished sequences are freed, not kept for a later prompt that might
            # share their prefix: the cache in use is the running sequences' alone.
            allow_block_sharing=False,
            # The token choice runs Python at every step (each sampled row's own generator):
            # no graph replays a step without it, and no step is prepared before the last
            # one's choice is made.
            use_cuda_graph=False,
            use_async_batching=False,
        )
        one_forward_at_a_time(model)
        self._manager: Any = model.init_continuous_batching(
            generation_config=config, continuous_batching_config=sizes
        )
        # After transformers checked the model's attention for its own way; before the loop's
        # thread sets up its inputs (no mask over the whole batch for this attention).
        self._paged = paged_attention.install(model)
        self._model = model
        self._choice = row_choice.install(self._manager)
        self._device: Any = model.device
        self._ids = itertools.count()
        self._manager.start()

    def warm_up(self, prompt_ids: list[int], new_tokens: int) -> None:
        """One request through the loop, waited for on the calling thread."""
        request_id = self._manager.add_request(prompt_ids, "warm-up", max_new_tokens=new_tokens)
        deadline = time.monotonic() + WARMUP_SECONDS
        while time.monotonic() < deadline:
            output = self._manager.get_result(request_id, timeout=1.0)
            if output is not None and output.is_finished():
                row_choice.verify(self._manager, self._choice)
                return
        raise RuntimeError(f"the generation loop gave no answer in {WARMUP_SECONDS:.0f} s")

    def sequence_tokens(self) -> int:
        """The most tokens one sequence may hold: the paged cache's, all of it. A sequence
        longer than the cache stops transformers' loop for every sequence ("no requests
        can be scheduled and no requests can be offloaded")."""
        return int(self._manager.batch_processor.cache.max_tokens_read)

    def state(self) -> LoopState:
        processor = self._manager.batch_processor
        if processor is None:  # before the loop's first step
            return LoopState(0, 0, 0.0)
        scheduler = processor.scheduler
        used = 1.0 - float(processor.cache.compute_free_capacity(relative=True))
        return LoopState(len(scheduler.active_requests), len(scheduler.waiting_requests), used)

    def stop(self) -> None:
        from carpool_model_server import paged_attention

        self._manager.stop(block=True, timeout=10.0)
        if self._paged:
            paged_attention.uninstall(self._model)

    async def generate(self, request: Request) -> AsyncGenerator[Piece, None]:
        """The request's answer, piece by piece as its tokens come. Closing the iterator
        early (the caller left) ends the sequence at the loop's next step."""
        # Each output holds the sequence's tokens so far: a reader held up (a slow sidecar)
        # needs only the newest. transformers calls the handler on this thread (by
        # call_soon_threadsafe from its own, a step's outputs in one callback, in order).
        outputs: Latest[Any] = Latest(final=_final)
        request_id = f"carpool-{next(self._ids)}"
        self._manager.register_result_handler(request_id, outputs.put)
        text = StreamedText(self.tokenizer, request.prompt_ids)
        shown = ""
        read = 0  # tokens of the last output read
        finished = False  # by the loop: nothing to cancel
        try:
            added = self._manager.add_request(
                request.prompt_ids,
                request_id,
                max_new_tokens=request.max_new_tokens,
                streaming=True,
                eos_token_id=self.eos_ids,
                **row_choice.request_settings(request.temperature, request.seed, self._device),
            )
            if added is None:  # transformers drops a request once its loop stopped
                error = self._manager.background_thread_status.fatal_error
                cause = "" if error is None else f": {error!r}"  # recorded after the stop
                raise DeviceFailed(f"the generation loop stopped{cause}")
            while True:
                output = await outputs.get()
                if output.error is not None:
                    # The reason transformers' loop takes no more requests, if it does not.
                    stopped = self._manager.background_thread_status.can_accept_new_requests()
                    if stopped is not None:
                        # A step raised (the device out of memory, say): transformers'
                        # loop stops for good, failing every sequence it holds.
                        raise DeviceFailed(f"the generation loop stopped: {output.error}")
                    raise RuntimeError(f"generation failed: {output.error}")
                finished = output.is_finished()
                tokens: list[int] = output.generated_tokens
                answer = self._answer(tokens, text.extend(tokens), request, finished, read)
                read = len(tokens)
                if answer is not None:
                    yield Piece(_rest(answer.text, shown), answer)
                    return
                visible = _visible(text.text, request.stop)
                if len(visible) > len(shown) and visible.startswith(shown):
                    yield Piece(visible[len(shown) :])
                    shown = visible
        finally:
            if not finished:  # the caller left, or a stop string ended it
                self._manager.cancel_request(request_id)
            # Its handler would otherwise stay registered: a cancelled request gets no
            # finished output that would remove it.
            router = self._manager.output_router
            with router._lock:
                router.result_handlers.pop(request_id, None)
            # Tokens of a step that ran as a stream closed come with no handler to take
            # them: transformers queues them for `get_result`, which only the warm-up calls.
            with contextlib.suppress(queue.Empty):
                while True:
                    router.output_queue.get_nowait()

    def _answer(
        self, tokens: list[int], text: str, request: Request, done: bool, read: int
    ) -> Answer | None:
        """The whole answer once the sequence ended or a stop string cut its `text` (that
        of `tokens` so far, the first `read` of them without one), else None."""
        answer = finish(self.tokenizer, self.eos_ids, tokens, request) if done else None
        stopped = answer is not None and answer.finish_reason == generation.STOP_SEQUENCE
        if stopped or cut_at_stop(text, request.stop) != text:
            return self._first_stop(tokens, read, request) or answer
        return answer

    def _first_stop(self, tokens: list[int], read: int, request: Request) -> Answer | None:
        """The answer a stop string cut at the fewest tokens past the `read` ones whose text
        holds it, if any: when they came at once (their reader fell behind), it counts the
        tokens a reader that kept up got, as the static way does. Each count is looked at,
        not sought by halves: a later token may rewrite the text that held a stop string (a
        byte that makes the "é" before it no UTF-8), and then the whole text holds none."""
        for count in range(read + 1, len(tokens) + 1):
            answer = finish(self.tokenizer, self.eos_ids, tokens[:count], request)
            if answer.finish_reason == generation.STOP_SEQUENCE:
                return answer
        return None


def _final(output: Any) -> bool:
    """Whether a loop's output is a sequence's last (its end, or its error)."""
    return output.is_finished() or output.error is not None


def _visible(text: str, stop: tuple[str, ...]) -> str:
    """The text so far that no later token can change: a tail that begins a stop string
    is held (as is a character still being spelt out: `StreamedText`)."""
    return text[: len(text) - stop_tail(text, stop)] if stop else text


def stop_tail(text: str, stop: tuple[str, ...]) -> int:
    """The length of the longest tail of `text` that some stop string begins with (short of
    the whole string, which ends the answer instead): later tokens may complete it."""
    for length in range(min(len(text), max(map(len, stop), default=1) - 1), 0, -1):
        tail = text[-length:]
        if any(each.startswith(tail) for each in stop):
            return length
    return 0


def _rest(text: str, shown: str) -> str:
    """What of the answer `text` the stream has not shown yet."""
    if not text.startswith(shown):
        # Decoding more tokens rewrote earlier text (a tokenizer that merges across
        # tokens): the pieces already sent stand, the answer's end follows them.
        log.warning("streamed text is no prefix of the answer: %r, %r", shown[-20:], text[-20:])
    return text[len(shown) :]
