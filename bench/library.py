"""carpool as a library, measured in process: offline sorted vs unsorted, and batched vs
one-at-a-time text generation. Rounds alternate the two sides; medians are reported.

    python bench/library.py offline --count 1000 --rounds 3 --torch-threads 1
    python bench/library.py generate --prompts 32 --rounds 3 --torch-threads 1

`generate` uses a random-weight GPT-2 of the shape given (no download) and a word-level
tokenizer: tokens/s depend on the shape, not on the weights.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from carpool.loadgen.workload import text_items
from carpool.offline import BatchInference, Stats

TESTS_DIR = Path(__file__).resolve().parents[1] / "tests"


def offline(args: argparse.Namespace) -> None:
    texts = text_items(args.count, "mixed", random.Random(0))
    records = [{"text": text} for text in texts]
    figures: dict[bool, list[Stats]] = {True: [], False: []}
    with BatchInference(
        "text-embedding", batch_size=args.batch_size, torch_threads=args.torch_threads
    ) as inference:
        for round_ in range(args.rounds):
            for sort in (True, False) if round_ % 2 == 0 else (False, True):
                inference.reset_stats()
                for _ in inference.run(records, sort_by_length=sort):
                    pass
                figures[sort].append(inference.stats)
                print(f"round {round_} sorted={sort}: {inference.stats.summary()}", flush=True)
    for sort, runs in figures.items():
        rate = statistics.median(s.items_per_second for s in runs)
        padding = statistics.median(s.padding_ratio for s in runs)
        print(f"sorted={sort}: median {rate:.1f} items/s, padding ratio {padding:.3f}")


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
    rates: dict[int, list[float]] = {args.batch_size: [], 1: []}
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
                for _, results in inference.run(records):
                    for result in results:
                        assert result.outputs is not None, result.error
                        data = result.outputs["text_output"].data
                        assert isinstance(data, list)
                        tokens += len(data[0].split())  # one word per token
                rate = tokens / inference.stats.seconds
                rates[size].append(rate)
                print(f"round {round_} batch {size}: {tokens} tokens, {rate:.1f} tokens/s")
    for size, values in rates.items():
        print(f"batch {size}: median {statistics.median(values):.1f} tokens/s")


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
    args = parser.parse_args()
    torch.manual_seed(0)
    offline(args) if args.bench == "offline" else generate(args)


if __name__ == "__main__":
    main()
