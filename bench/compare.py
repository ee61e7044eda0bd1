"""Side by side: the same model and request mix without batching, through carpool, and
through the peers' batching (Ray Serve, LitServe, MLServer, BentoML), in alternating
rounds, against the model's own limit at every batch size the load can form.

    python bench/compare.py                      # MiniLM, concurrency 1,8,32,64, 3 rounds
    python bench/compare.py --install-peers      # build the peers' venvs first (downloads)
    python bench/compare.py --peers litserve     # only this peer; --peers none: no peer
    python bench/compare.py --model trivial      # the HTTP front's own cost, concurrency 64
    python bench/compare.py --device cuda:0 --text-length long   # a batch-friendly GPU run
    python bench/compare.py --handler stand-in --handler-options preset=fast   # a GPU's timing
    python bench/compare.py --model bert-large --device cuda:0 --dtype fp16    # GPU-bound
    python bench/compare.py --model resnet18 --peers litserve   # image classification

Each round starts every variant in turn (unbatched, carpool, then each peer whose venv is
built), loads it at every concurrency, stops it, then measures the model's in-process limit
at each batch size min(clients, max batch size) and at the powers of two, beside the
accelerator's own ceiling there (the forward pass alone, batches prepared in advance). On a
GPU, with nvidia-ml-py installed, each cell records the GPU's mean utilisation. The summary
gives the median and range over rounds, and ratios paired round by round. `--model resnet18`
serves a ResNet-18-shaped classifier with random weights (bench/image_model.py) through the
image-classification handler, each request one 3 x 224 x 224 FP32 image as the model takes it
(`input=fp32`), at concurrency 1, 8, 32 by default, without the in-process limit.
Everything lands in `--results` as summary.txt and results.json, rewritten after every cell
(a run that is stopped keeps what it measured), and compare.png at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import click
import gpu_usage
import image_model
import peers
import servers
import summary

from carpool import processes
from carpool.comma_list import CommaList
from carpool.engine.settings import BatchingSettings
from carpool.loadgen import runner, workload
from carpool_model_server.config import DTYPES

DEFAULTS = BatchingSettings()
LIMIT_SCRIPT = servers.BENCH_DIR / "limit.py"
# --model: the handler each serves by default, and its name in URLs.
MODELS = {
    "minilm": ("text-embedding", "text-embedding"),
    "bert-large": ("large_encoder:LargeEncoderHandler", "bert-large"),
    "trivial": ("toy", "toy"),
    "resnet18": ("image-classification", "image-classification"),
}


class CpuRange(click.ParamType):
    """One part of a CPU list: 3, or 1-3."""

    name = "cpus"

    def convert(
        self, value: str, param: click.Parameter | None, ctx: click.Context | None
    ) -> range:
        first, _, last = value.partition("-")
        try:
            return range(int(first), int(last or first) + 1)
        except ValueError:
            self.fail(f"{value!r} is not a CPU like 0 or a range like 1-3", param, ctx)


def _cpus(ranges: tuple[range, ...] | None) -> frozenset[int] | None:
    """A CPU list such as 0 or 1-3,6 (as taskset takes it)."""
    if ranges is None:
        return None
    cpus = frozenset(cpu for part in ranges for cpu in part)
    unknown = cpus - os.sched_getaffinity(0)
    if not cpus or unknown:
        raise click.BadParameter(f"CPUs {sorted(unknown)} are not available here")
    return cpus


async def _measure(
    server: servers.Running,
    prepared: list[workload.PreparedRequest],
    levels: tuple[int, ...],
    round_number: int,
    duration: float,
    warmup: float,
    progress: bool,
    gpu: gpu_usage.GpuSampler,
    record: Callable[[summary.Measurement], None],
) -> None:
    """Every concurrency against one running server, after a warm-up at the highest; each
    cell is recorded as soon as it is measured."""
    if warmup > 0:
        await runner.run(
            runner.RunSettings(
                url=server.url,
                mode="concurrency",
                levels=(max(levels),),
                duration=warmup,
                warmup_seconds=0,
                progress=False,
            ),
            prepared,
        )
    for level in levels:
        before = server.cpu_seconds()
        gpu.start()
        [cell] = await runner.run(
            runner.RunSettings(
                url=server.url,
                mode="concurrency",
                levels=(level,),
                duration=duration,
                metrics_url=server.url + "/metrics",
                warmup_seconds=0,
                progress=progress,
            ),
            prepared,
        )
        usage = gpu.stop()
        after = server.cpu_seconds()
        record(
            summary.Measurement(
                variant=server.variant,
                round=round_number,
                concurrency=level,
                cell=cell,
                front_cpu_seconds=after["front"] - before["front"],
                model_cpu_seconds=after["model"] - before["model"],
                gpu_utilisation_percent=None if usage is None else usage.mean_percent,
            )
        )


def _limit_sizes(levels: tuple[int, ...], max_batch_size: int) -> tuple[int, ...]:
    """The batch size each concurrency can form, and the powers of two for the best one."""
    powers = [2**exponent for exponent in range(max_batch_size.bit_length())]
    formed = (summary.formable(level, max_batch_size) for level in levels)
    return tuple(sorted({*powers, *formed}))


def _limit(
    settings: servers.ModelSettings,
    sizes: tuple[int, ...],
    round_number: int,
    results: Path,
    cpus: frozenset[int] | None,
    text_length: workload.TextLength,
) -> list[summary.Limit]:
    """The model alone, in process, at each of `sizes` (bench/limit.py), on the same text
    mix as the servers.

    limit.py prints one row per batch size: size, ms per batch, items/s, forward items/s.
    """
    command = servers.limit_command(settings, text_length, sizes)
    log_path = results / "logs" / f"limit-{round_number}.log"
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=processes.environment(servers.OFFLINE),
        check=False,
        # On the servers' CPUs, like the servers it is compared with.
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    log_path.write_text(done.stdout + done.stderr)
    limits = []
    for line in done.stdout.splitlines():
        fields = line.split()
        try:
            size, _, items_per_second, forward = int(fields[0]), *map(float, fields[1:4])
        except (IndexError, ValueError):
            continue  # the header lines
        limits.append(summary.Limit(round_number, size, items_per_second, forward))
    if done.returncode != 0 or not limits:
        click.echo(f"limit: bench/limit.py failed ({done.returncode}); see {log_path}", err=True)
        return []
    return limits


def _peer_variants(
    names: tuple[str, ...], install: bool, settings: servers.ModelSettings
) -> list[servers.Variant]:
    """The peers asked for whose venvs are built (or built now, with `install`)."""
    variants = []
    for name in names:
        peer = peers.PEERS[name]
        if peers.python_for(peer, install) is None:
            click.echo(
                f"{name}: skipped, not installed in {peer.venv} (add --install-peers)", err=True
            )
        else:
            variants.append(peer.variant(settings))
    return variants


@click.command()
@click.option(
    "--model",
    type=click.Choice(list(MODELS)),
    default="minilm",
    show_default=True,
    help="minilm: all-MiniLM-L6-v2 (or --handler); bert-large: a BERT-large-shaped encoder "
    "built from a config with a fixed seed (bench/large_encoder.py, no download); trivial: "
    "the toy model, to cost the front; resnet18: image classification of 224 x 224 images.",
)
@click.option(
    "--handler",
    default=None,
    help="carpool handler: toy and stand-in are sent floats, any other text "
    "(a BYTES input named 'text') [default: text-embedding | toy]",
)
@click.option(
    "--handler-options",
    default="",
    help="The handler's own key=value,... for every variant, e.g. preset=fast for stand-in.",
)
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default="fp32",
    show_default=True,
    help="The model's dtype in every variant and the limit; fp16 needs CUDA.",
)
@click.option("--model-name", default=None, help="Name served in URLs [default: the handler].")
@click.option(
    "--concurrency",
    type=CommaList(click.IntRange(min=1)),
    default=None,
    help="[default: 1,8,32,64; trivial: 64]",
)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--duration", type=float, default=10.0, show_default=True, help="s per cell")
@click.option("--warmup", type=float, default=3.0, show_default=True, help="s per server start")
@click.option("--torch-threads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda:N")
@click.option(
    "--text-length",
    type=click.Choice(workload.TEXT_LENGTHS),
    default="mixed",
    show_default=True,
    help="long: about 150 words per request, for a batch-friendly GPU run.",
)
@click.option("--max-batch-size", type=int, default=DEFAULTS.max_batch_size, show_default=True)
@click.option("--max-wait-ms", type=float, default=DEFAULTS.max_wait_ms, show_default=True)
@click.option(
    "--peers",
    "peer_names",
    type=CommaList(click.Choice(list(peers.PEERS)), none_word="none"),
    default=tuple(peers.PEERS),
    help=f"Some of {','.join(peers.PEERS)}, or none [default: all whose venv is built].",
)
@click.option(
    "--install-peers", is_flag=True, help="Build the missing peers' venvs under .cache/ first."
)
@click.option("--no-limit", is_flag=True, help="Skip the in-process limit.")
@click.option(
    "--loadgen-cpus",
    type=CommaList(CpuRange()),
    default=None,
    help="Pin the load generator, e.g. 0 [default: unpinned].",
)
@click.option(
    "--server-cpus",
    type=CommaList(CpuRange()),
    default=None,
    help="Pin every server, e.g. 1-3 [default: unpinned].",
)
@click.option("--ready-timeout", type=float, default=300.0, show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=None)
@click.option("--quiet", is_flag=True, help="No progress bars.")
def main(
    model: str,
    handler: str | None,
    handler_options: str,
    dtype: str,
    model_name: str | None,
    concurrency: tuple[int, ...] | None,
    rounds: int,
    duration: float,
    warmup: float,
    torch_threads: int,
    device: str,
    text_length: workload.TextLength,
    max_batch_size: int,
    max_wait_ms: float,
    peer_names: tuple[str, ...],
    install_peers: bool,
    no_limit: bool,
    loadgen_cpus: tuple[range, ...] | None,
    server_cpus: tuple[range, ...] | None,
    ready_timeout: float,
    results: Path | None,
    quiet: bool,
) -> None:
    """Compare unbatched serving, carpool and the peers' batching on one model."""
    trivial, images = model == "trivial", model == "resnet18"
    pinned_loadgen, pinned_servers = _cpus(loadgen_cpus), _cpus(server_cpus)
    if pinned_loadgen is not None:
        os.sched_setaffinity(0, pinned_loadgen)
    default_handler, default_name = MODELS[model]
    model_path = ""
    if images:
        handler = default_handler
        handler_options = ",".join(filter(None, ("input=fp32", handler_options)))
        folder = servers.REPO_DIR / ".cache" / "bench" / "resnet18-random"
        model_path = str(image_model.resnet18(folder))
    handler = handler or default_handler
    levels = concurrency or ((64,) if trivial else (1, 8, 32) if images else (1, 8, 32, 64))
    settings = servers.ModelSettings(
        handler=handler,
        model_name=model_name or (default_name if handler == default_handler else handler),
        device=device,
        torch_threads=torch_threads,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        handler_options=handler_options,
        dtype=dtype,
        model_path=model_path,
    )
    variants = [servers.unbatched(settings), servers.carpool(settings)]
    # The toy model and the stand-in take floats, which the peer apps are not written for.
    toy = handler in servers.FLOAT_HANDLERS
    if toy:
        click.echo(f"peers: skipped for {handler}", err=True)
    else:
        variants += _peer_variants(peer_names, install_peers, settings)
    # bench/limit.py sends text.
    measure_limit = not (trivial or images or no_limit)
    if measure_limit and not LIMIT_SCRIPT.exists():
        click.echo(f"limit: skipped, {LIMIT_SCRIPT} is missing", err=True)
        measure_limit = False

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    results = results or servers.REPO_DIR / ".cache" / "bench" / f"compare-{model}-{stamp}"
    (results / "logs").mkdir(parents=True, exist_ok=True)
    spec = workload.WorkloadSpec(
        protocol="oip-json",
        payload="toy" if toy or images else "text",
        model_name=settings.model_name,
        input_name="image" if images else "input" if toy else "text",
        input_shape=image_model.ITEM_SHAPE if images else (4,),
        text_length=text_length,
    )
    prepared = workload.build(spec)
    run_settings = {
        **dataclasses.asdict(settings),
        "model": model,
        "payload": "image" if images else spec.payload,
        "text_length": None if toy or images else text_length,
        "concurrency": list(levels),
        "rounds": rounds,
        "duration_seconds": duration,
        "warmup_seconds": warmup,
        "variants": [variant.name for variant in variants],
        "python": sys.version.split()[0],
        "loadgen_cpus": sorted(os.sched_getaffinity(0)),
        "server_cpus": sorted(pinned_servers) if pinned_servers else None,
    }
    gpu = gpu_usage.GpuSampler.for_device(device)
    run_settings["gpu_sampled"] = gpu.available

    measurements: list[summary.Measurement] = []
    limits: list[summary.Limit] = []

    def record(measurement: summary.Measurement) -> None:
        measurements.append(measurement)
        summary.write(results, measurements, limits, run_settings)

    # SIGTERM stops the run as Ctrl-C does: the server in its turn is stopped, and what was
    # measured stays in `results`.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for round_number in range(1, rounds + 1):
            for variant in variants:
                click.echo(f"round {round_number}/{rounds}: {variant.name}", err=True)
                log_path = results / "logs" / f"{variant.name}-{round_number}.log"
                with servers.started(variant, log_path, ready_timeout, pinned_servers) as server:
                    asyncio.run(
                        _measure(
                            server,
                            prepared,
                            levels,
                            round_number,
                            duration,
                            warmup,
                            not quiet,
                            gpu,
                            record,
                        )
                    )
            if measure_limit:
                click.echo(f"round {round_number}/{rounds}: limit", err=True)
                limits += _limit(
                    settings,
                    _limit_sizes(levels, max_batch_size),
                    round_number,
                    results,
                    pinned_servers,
                    text_length,
                )
                summary.write(results, measurements, limits, run_settings)
    except KeyboardInterrupt:
        click.echo(f"stopped: what was measured is in {results}", err=True)
        sys.exit(130)

    click.echo(summary.write(results, measurements, limits, run_settings))
    summary.plot(
        measurements,
        limits,
        max_batch_size,
        results / "compare.png",
        f"{handler} ({dtype}) on {device}, torch threads {torch_threads}",
    )
    click.echo(f"results in {results}", err=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
