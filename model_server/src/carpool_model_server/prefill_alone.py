"""A schedule for the token loop's steps that prefills new prompts in steps of their own.

On a device without a paged attention kernel (a CPU) transformers' continuous batching runs
a step's attention as one masked attention of all its query tokens over all the keys its
sequences have cached, so a step costs about (query tokens) x (cached tokens of the batch).
With FIFO, a newcomer's prompt is prefilled in a step beside every decoding sequence: 130
prompt tokens attend to the thousands of tokens the others have cached, and that step costs
tens of times the same prefill alone, which is the newcomer's first token. Here a step that
has new prompts to prefill runs them alone (their own keys only) and the decoding sequences
wait that step out; steps without new prompts decode as FIFO does. A newcomer's first token
then costs about a lone prefill plus the rest of the step in progress, and the sequences
already running lose one short step per arrival.

Prompts waiting together (a burst of arrivals, or several during one step) are prefilled
shortest first, a prompt split over steps finishing before any other starts: each step is
filled to its token budget either way, so the work is the same, but the median first token
comes after the short prompts' prefills rather than after the long ones' before them. A
long prompt starts with what a step's budget leaves after the shorter ones. So that a
steady stream of short prompts cannot starve a long one, a prompt that has waited
PATIENCE_S goes ahead of shorter ones, in arrival order; prompts whose cache was moved to
the CPU keep the place transformers gives them (first, as they are cheaper to restore).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from transformers.generation.continuous_batching.requests import RequestStatus
from transformers.generation.continuous_batching.scheduler import (
    SCHEDULER_MAPPING,
    FIFOScheduler,
)

NAME = "prefill_alone"
# A waiting prompt older than this is no longer passed over by shorter ones.
PATIENCE_S = 0.5


class PrefillAloneScheduler(FIFOScheduler):
    def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
        prompts = [
            state
            for state in self.active_requests.values()
            if state.status == RequestStatus.PREFILLING
        ]
        if not self.block_new_requests:
            prompts += waiting_order(self._get_waiting_candidates(), time.perf_counter())
        if prompts:
            leaving: set[str] = set()
            scheduled, _, fast, query_tokens, read = self._process_candidates(
                prompts, token_budget, cache_budget, leaving
            )
            self._cleanup_waiting_queue(leaving)
            if scheduled:
                return scheduled, fast, query_tokens, read
        # No prompt, or none the cache has room for: the decoding sequences go on.
        return super().schedule_batch(token_budget, cache_budget)


def waiting_order(candidates: Sequence[Any], now: float) -> list[Any]:
    """Waiting requests in the order to prefill them: those restored from the CPU first,
    then prompts that waited PATIENCE_S by arrival, then the rest shortest first. `now` is
    on transformers' clock for `created_time`, `time.perf_counter`."""

    def rank(state: Any) -> tuple[int, float]:
        if state.is_cpu_offloaded:
            return 0, 0.0  # (a stable sort keeps transformers' order among them)
        if now - state.created_time >= PATIENCE_S:
            return 1, state.created_time
        return 2, len(state.remaining_prefill_tokens)  # a waiting prompt's whole length

    return sorted(candidates, key=rank)


def register() -> None:
    """Make the schedule one that transformers' continuous batching takes by NAME."""
    SCHEDULER_MAPPING.setdefault(NAME, PrefillAloneScheduler)
