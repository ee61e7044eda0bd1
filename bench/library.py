"""carpool as a library, measured in process: offline sorted vs unsorted, and batched vs
one-at-a-time text generation. Rounds alternate the two sides; medians are reported.

    python bench/library.py offline --count 1000 --rounds 3 --torch-threads 1
    python bench/library.py generate --prompts 32 --rounds 3 --torch-threads 1
    PYTHONPATH=<ray> python bench/library.py decorator --rounds 5   # vs Ray's @serve.batch

`generate` uses a random-weight GPT-2 of the shape given (no download) and a word-level
tokenizer: tokens/s depend on the shape, not on the weights. Besides wall-clock rates, each
side reports its rate per CPU-second of this process: on a machine shared with other work
that figure is the steadier one.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import carpool
from carpool.loadgen.workload import text_items
from carpool_model_server.offline import BatchInference, Stats

TESTS_DIR = Path(__file__).resolve().parents[1] / "tests"


def offline(args: argparse.Namespace) -> None:
    texts = text_items(args.count, "mixed", random.Random(0))
    records = [{"text": text} for text in texts]
    figures: dict[bool, list[tuple[Stats, float]]] = {True: [], False: []}
    with BatchInference(
        "text-embedding", batch_size=args.batch_size, torch_threads=args.torch_threads
    ) as inference:
        for round_ in range(args.rounds):
            for sort in (True, False) if round_ % 2 == 0 else (False, True):
                inference.reset_stats()
                cpu = time.process_time()
                for _ in inference.run(records, sort_by_length=sort):
                    pass
                per_cpu = args.count / (time.process_time() - cpu)
                figures[sort].append((inference.stats, per_cpu))
                print(
                    f"round {round_} sorted={sort}: {inference.stats.summary()}, "
                    f"{per_cpu:.1f} items per CPU-second",
                    flush=True,
                )
    for sort, runs in figures.items():
        rate = statistics.median(stats.items_per_second for stats, _ in runs)
        per_cpu = statistics.median(cpu for _, cpu in runs)
        padding = statistics.median(stats.padding_ratio for stats, _ in runs)
        print(
            f"sorted={sort}: median {rate:.1f} items/s, {per_cpu:.1f} items per CPU-second, "
            f"padding ratio {padding:.3f}"
        )


def generate(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(TESTS_DIR))
    from library.tiny_lm import WORDS, build_tiny_lm

    folder = build_tiny_lm(Path(tempfile.mkdtemp()), layers=args.layers, width=args.width)
    rng = random.Random(0)
    records = [
        {"text_input": " ".join(rng.choices(WORDS, k=rng.randint(4, 48))),
         "max_new_tokens": args.new_tokens}
        for _ in range(args.prompts)
    ]  # fmt: skip
    rates: dict[int, list[tuple[float, float]]] = {args.batch_size: [], 1: []}
    for round_ in range(args.rounds):
        order = (args.batch_size, 1) if round_ % 2 == 0 else (1, args.batch_size)
        for size in order:
            with BatchInference(
                "text-generation",
                batch_size=size,
                model_path=folder,
                torch_threads=args.torch_threads,
            ) as inference:
                tokens = 0
                cpu = time.process_time()
                for _, results in inference.run(records):
                    for result in results:
                        assert result.outputs is not None, result.error
                        data = result.outputs["text_output"].data
                        assert isinstance(data, list)
                        tokens += len(data[0].split())  # one word per token
                rate = tokens / inference.stats.seconds
                per_cpu = tokens / (time.process_time() - cpu)
                rates[size].append((rate, per_cpu))
                print(
                    f"round {round_} batch {size}: {tokens} tokens, {rate:.1f} tokens/s, "
                    f"{per_cpu:.1f} per CPU-second",
                    flush=True,
                )
    for size, values in rates.items():
        rate = statistics.median(wall for wall, _ in values)
        per_cpu = statistics.median(cpu for _, cpu in values)
        print(f"batch {size}: median {rate:.1f} tokens/s, {per_cpu:.1f} per CPU-second")


async def decorator_round(kind: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """Calls/s, calls per CPU-second and p99 latency (ms) of `callers` clients each making
    `calls` calls."""

    async def model(items: list[int]) -> list[int]:
        await asyncio.sleep(args.batch_ms / 1000)  # an accelerator call, awaited
        return [item + 1 for item in items]

    if kind == "carpool":
        batched = carpool.batch(max_batch_size=args.batch_size, max_wait_ms=args.wait_ms)(model)
        call, close = batched.__call__, batched.aclose
    else:
        from ray import serve
        from ray.serve import batching

        # Outside a deployment only this warning check needs a replica; the batching is as is.
        batching._BatchQueue._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda self: (
            None
        )
        call = serve.batch(
            max_batch_size=args.batch_size, batch_wait_timeout_s=args.wait_ms / 1000
        )(model)
        close = None
    latencies: list[float] = []

    async def client(offset: int) -> None:
        for n in range(args.calls):
            started = time.monotonic()
            assert await call(offset + n) == offset + n + 1
            latencies.append(time.monotonic() - started)

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(client(1000 * c) for c in range(args.callers)))
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    if close is not None:
        await close()
    latencies.sort()
    p99 = 1000 * latencies[int(0.99 * (len(latencies) - 1))]
    return len(latencies) / elapsed, len(latencies) / cpu, p99


def decorator(args: argparse.Namespace) -> None:
    kinds = ["carpool", "ray"] if args.ray else ["carpool"]
    figures: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    for round_ in range(args.rounds):
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            rate, per_cpu, p99 = asyncio.run(decorator_round(kind, args))
            figures[kind].append((rate, per_cpu, p99))
            print(
                f"round {round_} {kind}: {rate:.0f} calls/s, {per_cpu:.0f} per CPU-second, "
                f"p99 {p99:.1f} ms",
                flush=True,
            )
    for kind, values in figures.items():
        rate, per_cpu, p99 = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"{kind}: median {rate:.0f} calls/s, {per_cpu:.0f} per CPU-second, p99 {p99:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1)
    sub = parser.add_subparsers(dest="bench", required=True)
    one = sub.add_parser("offline")
    one.add_argument("--count", type=int, default=1000)
    one.add_argument("--batch-size", type=int, default=32)
    two = sub.add_parser("generate")
    two.add_argument("--prompts", type=int, default=32)
    two.add_argument("--batch-size", type=int, default=32)
    two.add_argument("--new-tokens", type=int, default=32)
    two.add_argument("--layers", type=int, default=4)
    two.add_argument("--width", type=int, default=256)
    three = sub.add_parser("decorator")
    three.add_argument("--callers", type=int, default=64)
    three.add_argument("--calls", type=int, default=100)
    three.add_argument("--batch-size", type=int, default=32)
    three.add_argument("--wait-ms", type=float, default=5.0)
    three.add_argument("--batch-ms", type=float, default=2.0)
    three.add_argument("--no-ray", dest="ray", action="store_false", help="carpool only")
    args = parser.parse_args()
    torch.manual_seed(0)
    {"offline": offline, "generate": generate, "decorator": decorator}[args.bench](args)


if __name__ == "__main__":
    main()
