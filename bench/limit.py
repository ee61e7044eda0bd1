"""The model's limit curve: in-process forward throughput (items/s) per batch size.

Runs preprocess -> infer -> postprocess directly on a handler (no HTTP, no sidecar), so the
figures are the ceiling any batching in front of the model can reach. Every batch size runs
the same pool of items (`--pool`), cut into consecutive full batches; prints one line per
size: the median over repetitions of the time per batch, items/s from it, and the
accelerator's own ceiling: items/s of the forward pass alone, on batches preprocessed (and
on the device) in advance, one device synchronisation per pass over the pool. Every size
from 1 to `--max-batch-size` by default: a load of c clients forms batches of at most c
items, so each concurrency has its own ceiling (bench/compare.py asks for those sizes).

    python bench/limit.py --handler text-embedding --torch-threads 1 --repeats 5
    python bench/limit.py --sizes 1,8,32 --max-batch-size 32

On CPU the thread count dominates the figures: always state it with them.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time
from collections.abc import Callable
from typing import get_args

import torch
from model_setup import build_handler

from carpool.comma_list import CommaList, KeyValue
from carpool.contract.wire import BYTES, Item, Tensor
from carpool.loadgen.workload import TextLength, text_items
from carpool_model_server.config import DTYPES
from carpool_model_server.handler import AnyHandler

# The input the load generator's text payload fills (bench/compare.py sends it).
TEXT_INPUT = "text"


def takes_text(handler: AnyHandler) -> bool:
    """Whether the handler reads a BYTES input named as the load's texts are (any handler
    of text, built in or a user's), once loaded: a handler may set its metadata in `load`."""
    return any(
        spec.name == TEXT_INPUT and spec.datatype == BYTES for spec in handler.metadata.inputs
    )


def sample_items(handler: AnyHandler, count: int, text_length: TextLength) -> list[Item]:
    """Texts from the load generator's mix for a handler of text, so the limit and the
    servers see the same work; the handler's example item for any other."""
    if takes_text(handler):
        texts = text_items(count, text_length, random.Random(0))
        return [{TEXT_INPUT: Tensor(BYTES, (1,), [text.encode()])} for text in texts]
    example = handler.example_item()
    if example is None:
        raise SystemExit(f"handler {type(handler).__name__} has no example item to benchmark with")
    return [example] * count


def _length(item: Item) -> int:
    """Bytes of BYTES inputs plus elements of numeric ones: what padding depends on."""
    total = 0
    for tensor in item.values():
        total += sum(map(len, tensor.data)) if isinstance(tensor.data, list) else len(tensor.data)
    return total


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of sizes like 1,8,32")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handler", default="text-embedding")
    parser.add_argument(
        "--handler-options",
        type=lambda text: CommaList(KeyValue()).convert(text, None, None),
        default=(),
        help="the handler's own key=value,... (e.g. preset=fast for stand-in)",
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", type=int, default=64, help="items run through each size")
    parser.add_argument(
        "--group-by-length",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="batch items of similar length together (default), as the sidecar's buckets do",
    )
    parser.add_argument("--text-length", choices=get_args(TextLength), default="mixed")
    parser.add_argument(
        "--sizes", type=_sizes, default=None, help="e.g. 1,8,32 [default: 1 to max batch size]"
    )
    args = parser.parse_args()
    sizes = args.sizes or tuple(range(1, args.max_batch_size + 1))
    if max(sizes) > args.max_batch_size:
        parser.error(f"--sizes {max(sizes)} is above --max-batch-size {args.max_batch_size}")

    torch.set_num_threads(args.torch_threads)
    handler, device = build_handler(
        args.handler, args.device, args.dtype, args.max_batch_size, args.handler_options
    )
    with torch.inference_mode():
        handler.load(device)
    print(f"handler={args.handler} device={device} dtype={args.dtype} ", end="")
    print(f"torch_threads={torch.get_num_threads()} repeats={args.repeats} ", end="")
    print(f"text_length={args.text_length} group_by_length={args.group_by_length}")
    print(f"{'batch':>5} {'ms/batch':>10} {'items/s':>10} {'forward items/s':>16}")
    # Every size runs the same pool of items, cut into consecutive batches: a size is never
    # flattered (or penalised) by drawing shorter (or longer) texts than another.
    pool = sample_items(handler, args.pool, args.text_length)
    if args.group_by_length:
        # Neighbours of similar length pad least: the ceiling of any length-aware batcher.
        pool.sort(key=_length)
    for size in sizes:
        # Full batches only, the pool read round as often as it takes: a last, partial
        # batch would mix a smaller size into this size's figure.
        count = -(-len(pool) // size) * size
        cycled = [pool[index % len(pool)] for index in range(count)]
        batches = [cycled[start : start + size] for start in range(0, count, size)]
        median = _median_pass(functools.partial(_whole, handler, batches), device, args.repeats)
        forward = _median_pass(_forward_only(handler, batches), device, args.repeats)
        print(
            f"{size:>5} {median * 1000 / len(batches):>10.2f} {count / median:>10.1f} "
            f"{count / forward:>16.1f}"
        )


def _whole(handler: AnyHandler, batches: list[list[Item]]) -> None:
    """preprocess -> infer -> postprocess, batch after batch, as the model server runs them."""
    for items in batches:
        prepared = handler.preprocess(items)
        assert prepared.batch is not None and not prepared.rejected
        outputs = handler.postprocess(handler.infer(prepared.batch))
        assert len(outputs) == len(items)


def _forward_only(handler: AnyHandler, batches: list[list[Item]]) -> Callable[[], None]:
    """The forward passes alone: every batch preprocessed (onto the device) beforehand."""
    with torch.inference_mode():
        prepared = [handler.preprocess(items).batch for items in batches]

    def run() -> None:
        for batch in prepared:
            handler.infer(batch)

    return run


def _median_pass(run: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Median seconds of `repeats` passes, after one that warms up; synchronised on CUDA,
    once a pass, so queued kernels count in the pass that queued them."""
    timings = []
    for repeat in range(repeats + 1):
        started = time.perf_counter()
        with torch.inference_mode():
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if repeat:
            timings.append(time.perf_counter() - started)
    return statistics.median(timings)


if __name__ == "__main__":
    main()
