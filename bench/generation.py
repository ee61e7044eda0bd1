"""Text generation four ways on one mixed workload: served by a sidecar and model server with
static batching and with continuous batching (`batching=continuous`), transformers'
continuous batching in process (the ceiling: no HTTP, no hops), and one request after
another in process (`model.generate`).

    python bench/generation.py --clients 32 --requests 64 --rounds 2 --torch-threads 2

Each request's prompt has 8 to 256 words and asks for 1 to 256 tokens, greedy, or with
`--sampled F` a share F of them sampled at temperature 1, each seeded with its index (the
served variants then draw the same texts and are compared with the first one's; the
in-process variants, greedy only, are left out). The model is a random-weight GPT-2 of the
shape given with a word-level tokenizer (no download). Served requests go to
`generate_stream` from `--clients` closed-loop clients; time to first token is to the first
event (for static batching, the whole answer's), inter-token latency the time between
events. The first `--clients` requests arrive together; "later" is the TTFT p50 of the
rest, each arriving into a running batch. Rounds alternate the variants; medians are
reported, and every variant's texts are compared with sequential `generate`'s, read after
the prompt as transformers' pipeline reads an answer (with `--skip sequential`, with the
first served variant's).

`--served` names the served variants as handler options, so that settings of the token
loop can be compared in one run:

    python bench/generation.py --skip sequential "in process" --served batching=static \
        batching=continuous batching=continuous,scheduler=prefill_first \
        batching=continuous,step_tokens=256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import torch

TESTS_DIR = Path(__file__).resolve().parents[1] / "tests"
Work = list[tuple[str, int, float]]  # prompt, tokens asked for, temperature (0: greedy)
SAMPLED_TEMPERATURE = 1.0


@dataclass(frozen=True, slots=True)
class Run:
    texts: list[str]
    tokens: int
    seconds: float
    first_token_s: list[float]
    gaps_s: list[float] = field(default_factory=list)  # between a request's events

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def workload(count: int, words: list[str], sampled: float, seed: int = 0) -> Work:
    rng = random.Random(seed)
    asks = [
        (" ".join(rng.choices(words, k=rng.randint(8, 256))), rng.randint(1, 256))
        for _ in range(count)
    ]
    # Drawn apart from the prompts: the same prompts whatever the share sampled.
    draws = random.Random(seed + 1)
    return [
        (prompt, new_tokens, SAMPLED_TEMPERATURE if draws.random() < sampled else 0.0)
        for prompt, new_tokens in asks
    ]


def sequential(model: Any, tokenizer: Any, work: Work) -> Run:
    from library.tiny_lm import after_prompt

    texts, tokens, firsts = [], 0, []
    started = time.monotonic()
    for prompt, new_tokens, _ in work:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            output = model.generate(
                ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=0
            )
        new = output[0, ids.shape[1] :].tolist()
        new = new[: new.index(0)] if 0 in new else new
        texts.append(after_prompt(tokenizer, ids[0].tolist(), new))
        tokens += len(new)
        firsts.append(time.monotonic() - started)
    return Run(texts, tokens, time.monotonic() - started, firsts[:1])


def in_process(model: Any, tokenizer: Any, work: Work) -> Run:
    from library.tiny_lm import after_prompt
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(do_sample=False, eos_token_id=0, pad_token_id=0, max_new_tokens=1)
    sizes = ContinuousBatchingConfig(
        num_blocks=1024, page_size=32, max_batch_tokens=2048, max_requests_per_batch=32
    )
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=sizes
    )
    manager.start()
    try:
        started = time.monotonic()
        ids, prompts = {}, []
        for index, (prompt, new_tokens, _) in enumerate(work):
            prompts.append(tokenizer(prompt)["input_ids"])
            ids[manager.add_request(prompts[-1], f"r{index}", max_new_tokens=new_tokens)] = index
        results: dict[int, list[int]] = {}
        while len(results) < len(work):
            output = manager.get_result(timeout=60)
            if output is not None and output.is_finished():
                new = list(output.generated_tokens)
                results[ids[output.request_id]] = new[: new.index(0)] if 0 in new else new
        seconds = time.monotonic() - started
    finally:
        manager.stop(block=True)
    texts = [after_prompt(tokenizer, prompts[i], results[i]) for i in range(len(work))]
    return Run(texts, sum(map(len, results.values())), seconds, [])


async def served(url: str, work: Work, clients: int) -> Run:
    texts = [""] * len(work)
    firsts = [0.0] * len(work)
    gaps: list[float] = []
    tokens = 0
    pending = list(enumerate(work))
    loop = asyncio.get_running_loop()

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while pending:
            index, (prompt, new_tokens, temperature) = pending.pop(0)
            parameters: dict[str, Any] = {"max_tokens": new_tokens}
            if temperature:
                parameters.update(temperature=temperature, seed=index)
            body = {"text_input": prompt, "parameters": parameters}
            sent = last = loop.time()
            pieces = []
            async with http.post(url, data=orjson.dumps(body)) as reply:
                assert reply.status == 200, await reply.read()
                async for line in reply.content:
                    if not line.startswith(b"data: "):
                        continue
                    event = orjson.loads(line[6:])
                    now = loop.time()
                    if pieces:
                        gaps.append(now - last)
                    else:
                        firsts[index] = now - sent
                    last = now
                    pieces.append(event["text_output"])
                    if event["done"]:
                        tokens += event["generated_tokens"]
            texts[index] = "".join(pieces)

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        started = loop.time()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = loop.time() - started
    return Run(texts, tokens, seconds, firsts, gaps)


async def lone_first_token(url: str, work: Work, count: int = 5) -> float:
    """The median time to first event of requests sent one at a time."""
    times = []
    for prompt, _, _ in work[:count]:
        run = await served(url, [(prompt, 8, 0.0)], 1)
        times.append(run.first_token_s[0])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument(
        "--served",
        nargs="+",
        default=["batching=static", "batching=continuous"],
        help="served variants, each as the handler's options",
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["sequential", "in process"], help="variants"
    )
    parser.add_argument(
        "--sampled", type=float, default=0.0, help="share of requests sampled, each seeded"
    )
    args = parser.parse_args()
    if args.sampled:
        args.skip = ["sequential", "in process"]  # they decode greedily
    # bench/library.py would shadow the tests' `library` folder.
    sys.path[:] = [str(TESTS_DIR), *(p for p in sys.path if Path(p) != Path(__file__).parent)]
    from library.tiny_lm import WORDS, build_tiny_lm
    from support.sidecar import run_pair
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.torch_threads)
    folder = Path(tempfile.mkdtemp())
    build_tiny_lm(folder / "lm", layers=args.layers, width=args.width, context=512)
    model = AutoModelForCausalLM.from_pretrained(folder / "lm").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder / "lm")
    work = workload(args.requests, WORDS, args.sampled)
    model_args = ["--model-path", str(folder / "lm"), "--device", "cpu", "--max-batch-size", "32"]
    model_args += ["--torch-threads", str(args.torch_threads), "--warmup-sizes", "1"]
    # Static batching takes minutes for this workload on a loaded CPU: no 504s.
    sidecar_args = ["--max-queue-items", "1024", "--timeout-ms", "3600000"]
    runs: dict[str, list[Run]] = {}
    lone: dict[str, list[float]] = {}
    variants: dict[str, Callable[[], Run]] = {
        "sequential": lambda: sequential(model, tokenizer, work),
        "in process": lambda: in_process(model, tokenizer, work),
    }
    for skipped in args.skip:
        del variants[skipped]
    for round_ in range(args.rounds):
        order = args.served if round_ % 2 == 0 else args.served[::-1]
        for index, options in enumerate(order):
            if "batching=continuous" in options and "cache_tokens" not in options:
                # Room for every client's prompt and answer.
                options += f",cache_tokens={args.clients * 512}"
            name = options.removeprefix("batching=").split(",cache_tokens")[0]
            run_dir = folder / f"run{round_}-{index}"
            run_dir.mkdir()
            with run_pair(
                run_dir,
                "text-generation",
                *sidecar_args,
                model_args=[*model_args, "--handler-options", options],
                model="gen",
            ) as pair:
                url = pair.sidecar.url + "/v2/models/gen/generate_stream"
                lone.setdefault(name, []).append(asyncio.run(lone_first_token(url, work)))
                runs.setdefault(name, []).append(asyncio.run(served(url, work, args.clients)))
        for name, variant in variants.items():
            runs.setdefault(name, []).append(variant())
    report(runs, lone, args, work)


def report(runs: dict[str, list[Run]], lone: dict[str, list[float]], args: Any, work: Work) -> None:
    first = next(iter(runs.values()))  # the first served variant
    reference = runs.get("sequential", first)[0].texts
    static_rate = statistics.median(run.rate for run in runs.get("static", first))
    print(
        f"{args.requests} requests, {args.clients} clients, GPT-2 {args.layers}x{args.width}, "
        f"{sum(t > 0 for _, _, t in work)} sampled, "
        f"torch threads {args.torch_threads}, {args.rounds} rounds (medians); "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[1]:.1f} (5 min)"
    )
    print(
        "| variant | tokens/s | vs static | TTFT p50 s | TTFT p90 s | lone TTFT s "
        "| TTFT p50 / lone | later p50 / lone | ITL p50 ms | ITL p90 ms | texts = reference |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, measured in runs.items():
        rate = statistics.median(run.rate for run in measured)
        first = _quantiles([run.first_token_s for run in measured])
        gaps = _quantiles([run.gaps_s for run in measured if run.gaps_s], scale=1000)
        later = _quantiles([run.first_token_s[args.clients :] for run in measured])[0]
        alone = statistics.median(lone[name]) if name in lone else None
        ratio, later_ratio = _per_lone(first[0], alone), _per_lone(later, alone)
        same = sum(
            text == want
            for run in measured
            for text, want in zip(run.texts, reference, strict=True)
        )
        total = len(reference) * len(measured)
        print(
            f"| {name} | {rate:.0f} | {rate / static_rate:.2f} | {first[0]} | {first[1]} "
            f"| {'-' if alone is None else f'{alone:.3f}'} | {ratio} | {later_ratio} "
            f"| {gaps[0]} | {gaps[1]} "
            f"| {same}/{total} |"
        )


def _per_lone(p50: str, alone: float | None) -> str:
    return f"{float(p50) / alone:.1f}" if alone and p50 != "-" else "-"


def _quantiles(samples: list[list[float]], scale: float = 1.0) -> tuple[str, str]:
    """The medians over runs of each run's p50 and p90, as text; '-' without samples."""
    samples = [each for each in samples if len(each) > 1]
    if not samples:
        return "-", "-"
    p50 = statistics.median(statistics.quantiles(each, n=10)[4] for each in samples)
    p90 = statistics.median(statistics.quantiles(each, n=10)[8] for each in samples)
    digits = 1 if scale > 1 else 3
    return f"{p50 * scale:.{digits}f}", f"{p90 * scale:.{digits}f}"


if __name__ == "__main__":
    main()
