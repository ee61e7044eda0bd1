"""Greedy and sampled sequences in one running batch of the token loop, each sampled one
drawing at its own temperature from its own seeded generator.

transformers' continuous batching decides greedy or sampled once for the whole loop, and
samples with torch's global generator, so a sampled sequence's tokens would depend on what
ran beside it. Here the loop stays greedy and a per-request logits processor of
transformers' own kind (`ContinuousBatchingLogitsProcessor`: it sees each step's sequences
in the order of the logits' rows, and each sequence's `add_request` keywords) chooses every
sampled row's token with `sampling.choose` and leaves that row only it; the loop's argmax
then takes it. A greedy row's logits go on untouched.

This is carpool's one reliance on the internals of transformers' continuous batching for
sampling (the transformers 5 line): the manager's `logit_processor` list is replaced before
its loop starts, and `tensors_required` sizes the per-row argument its inputs hold. `verify`
checks after the first step that the loop took it, and the tests of seeded requests check
the rest: a change there fails loudly rather than sampling quietly with the wrong rows.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)

from carpool_model_server import sampling

TEMPERATURE = "temperature"
GENERATOR = "generator"


class RowChoice(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {TEMPERATURE: float, GENERATOR: torch.Generator}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        # The generators of the step being prepared, one per row of its logits (None: greedy).
        self.generators: list[torch.Generator | None] = []

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.zero_()  # the bits of 0.0: greedy

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        settings = [request.state.logit_processor_kwargs for request in requests_with_new_token]
        self.generators = [each.get(GENERATOR) for each in settings]
        temperatures = [float(each.get(TEMPERATURE, 0.0)) for each in settings]
        # The loop's argument rows are int32: the float32's bits travel in them.
        return torch.tensor(temperatures, dtype=torch.float32).view(torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        drawing = {row: each for row, each in enumerate(self.generators) if each is not None}
        if not drawing:
            return scores
        if len(self.generators) > scores.size(0):
            raise RuntimeError(
                f"the token loop gave {scores.size(0)} rows of logits for "
                f"{len(self.generators)} sequences: transformers' logits processors changed"
            )
        temperatures = tensor_arg[: scores.size(0)].view(torch.float32)
        return sampling.only(scores, sampling.choose(scores, temperatures, drawing))


def install(manager: Any) -> ContinuousBatchingLogitsProcessorList:
    """Make `manager` (greedy, not started) choose each row's token with RowChoice."""
    if manager.batch_processor is not None or manager.logit_processor.do_processing:
        raise RuntimeError("the token choice goes into a greedy loop before it starts")
    processors = ContinuousBatchingLogitsProcessorList(LogitsProcessorList([RowChoice()]))
    processors.tensors_required = 1  # one argument row: the temperatures
    manager.logit_processor = processors
    return processors


def verify(manager: Any, processors: ContinuousBatchingLogitsProcessorList) -> None:
    """Raise unless the running loop chooses with `processors` (after its first step)."""
    runner = manager.batch_processor.model_runner
    if runner.logit_processor is not processors or runner.do_sample:
        raise RuntimeError(
            "transformers' continuous batching no longer takes carpool's token choice: "
            "sampled requests cannot share its loop"
        )


def request_settings(temperature: float, seed: int | None, device: torch.device) -> dict[str, Any]:
    """A request's `add_request` keywords: none for a greedy one."""
    if temperature <= 0:
        return {}
    return {TEMPERATURE: float(temperature), GENERATOR: sampling.generator(seed, device)}
