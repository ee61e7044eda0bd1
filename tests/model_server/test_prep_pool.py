"""Batches prepared on several cores: a handler whose preprocess runs concurrently gets a pool
of threads sized to the pod's CPUs; any other keeps one preprocess at a time."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from carpool.contract.wire import Item, Tensor
from carpool_model_server.handler import HandlerSettings, Prepared
from carpool_model_server.handler_text_embedding import TextEmbeddingHandler
from carpool_model_server.handler_toy import ToyHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.pod_cpus import pod_cpus
from carpool_model_server.runner import Runner

PREPROCESS_S = 0.1


class SlowTokenizer(ToyHandler):
    """The toy model with a preprocess that waits with the GIL released, as a tokenizer
    does; it records how many preprocess calls ran at once, and on which threads."""

    preprocess_overlaps_infer = True
    preprocess_concurrently = True

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.running = self.peak = 0
        self.threads: set[str] = set()
        self.torch_threads: set[int] = set()
        self._count = threading.Lock()

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        with self._count:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.threads.add(threading.current_thread().name)
            self.torch_threads.add(torch.get_num_threads())
        time.sleep(PREPROCESS_S)
        with self._count:
            self.running -= 1
        return super().preprocess(items)


class OneAtATime(SlowTokenizer):
    preprocess_concurrently = False


def item(value: float) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.full(4, value, dtype=np.float32))}


async def prepare_four_batches(handler_class: type[SlowTokenizer]) -> SlowTokenizer:
    handler = handler_class(HandlerSettings(None, torch.float32, 8))
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), 8, prep_threads=4)
    await runner.load(1, [])
    try:
        batches = [[item(10 * b + i) for i in range(3)] for b in range(4)]
        results = await asyncio.gather(*(runner.run(batch) for batch in batches))
    finally:
        runner.close()
    # Every item answered in order, whatever order the batches were prepared in.
    for batch, answers in zip(batches, results, strict=True):
        for sent, answer in zip(batch, answers, strict=True):
            assert answer.outputs is not None
            expected = sent["input"].to_numpy() * 2 + 1
            assert answer.outputs["output"].to_numpy().tolist() == expected.tolist()
    return handler


async def test_a_concurrent_preprocess_prepares_batches_on_several_threads() -> None:
    handler = await prepare_four_batches(SlowTokenizer)
    assert handler.peak == 4
    assert len(handler.threads) == 4 and all(t.startswith("carpool-prep") for t in handler.threads)
    # Each thread of the pool took the torch thread count the worker has.
    assert handler.torch_threads == {1}


async def test_any_other_handler_keeps_one_preprocess_at_a_time() -> None:
    handler = await prepare_four_batches(OneAtATime)
    assert handler.peak == 1


def test_text_embedding_tokenizes_concurrently() -> None:
    assert TextEmbeddingHandler.preprocess_concurrently
    assert TextEmbeddingHandler.preprocess_overlaps_infer


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("150000 100000\n", 2), ("100000 100000\n", 1), ("max 100000\n", None), (None, None)],
    ids=["1.5-cpus", "1-cpu", "unlimited", "no-cgroup-v2"],
)
def test_the_pool_is_sized_to_the_pods_cpus(
    tmp_path: Path, cpu_max: str | None, limit: int | None
) -> None:
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    here = len(os.sched_getaffinity(0))
    assert pod_cpus(path) == (here if limit is None else min(here, limit))
