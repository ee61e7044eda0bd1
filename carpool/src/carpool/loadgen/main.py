"""`carpool bench`: closed- or open-loop load against a sidecar, with a report."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import click

from carpool.comma_list import CommaList
from carpool.loadgen import report, runner, workload
from carpool.report_path import ReportPath

DEFAULT_CONCURRENCY = (1, 8, 32, 64)
# Input tensor names of the built-in handlers, so `--payload` alone is enough.
DEFAULT_INPUT_NAMES = {"text": "text", "toy": "input"}
DEFAULT_MODEL_NAMES = {"text": "text-embedding", "toy": "toy"}
# `carpool bench` and `carpool tune`: a request unanswered this long counts as failed.
timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=runner.REQUEST_TIMEOUT_S,
    show_default=True,
    help="Per request, s.",
)


@click.command()
@click.option("--url", default="http://127.0.0.1:8080", show_default=True, help="The sidecar.")
@click.option(
    "--metrics-url",
    default=None,
    help="Prometheus text for batching figures [default: URL/metrics]; 'none' to skip.",
)
@click.option("--model-name", default=None, help="[default: the payload's built-in handler]")
@click.option(
    "--protocol", type=click.Choice(workload.PROTOCOLS), default="oip-json", show_default=True
)
@click.option(
    "--grpc-target",
    default="127.0.0.1:8081",
    show_default=True,
    help="host:port of the sidecar's gRPC front, for --protocol grpc.",
)
@click.option(
    "--concurrency",
    type=CommaList(click.IntRange(min=1)),
    default=None,
    help="Closed loop: comma-separated client counts [default: "
    + ",".join(map(str, DEFAULT_CONCURRENCY))
    + "].",
)
@click.option(
    "--rate",
    type=CommaList(click.FloatRange(min=0, min_open=True)),
    default=None,
    help="Open loop: comma-separated requests/s (Poisson).",
)
@click.option("--duration", type=float, default=None, help="Seconds per load level [default: 10].")
@click.option("--requests", type=click.IntRange(min=1), default=None, help="Requests per level.")
@click.option("--warmup", type=float, default=1.0, show_default=True, help="Unrecorded seconds.")
@click.option("--payload", type=click.Choice(["text", "toy"]), default="toy", show_default=True)
@click.option("--input-name", default=None, help="[default: the payload's built-in input]")
@click.option(
    "--input-shape",
    type=CommaList(click.IntRange(min=1)),
    default="4",
    show_default=True,
    help="Per-item shape of toy payloads, e.g. 3,224,224.",
)
@click.option(
    "--text-length",
    type=click.Choice(workload.TEXT_LENGTHS),
    default="mixed",
    show_default=True,
    help="Text payloads: one sentence, one to four, or about 150 words.",
)
@click.option("--batch-per-request", type=click.IntRange(min=1), default=1, show_default=True)
@timeout_option
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=ReportPath(), default=None)
@click.option("--plot", "plot_path", type=ReportPath(), default=None)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def command(
    url: str,
    metrics_url: str | None,
    model_name: str | None,
    protocol: workload.Protocol,
    grpc_target: str,
    concurrency: tuple[int, ...] | None,
    rate: tuple[float, ...] | None,
    duration: float | None,
    requests: int | None,
    warmup: float,
    payload: Literal["text", "toy"],
    input_name: str | None,
    input_shape: tuple[int, ...],
    text_length: workload.TextLength,
    batch_per_request: int,
    timeout: float,
    seed: int,
    json_path: Path | None,
    plot_path: Path | None,
    quiet: bool,
) -> None:
    """Load a carpool sidecar (or any OIP/KServe v1 server) and report what it did."""
    if concurrency is not None and rate is not None:
        raise click.UsageError("give --concurrency or --rate, not both")
    if duration is not None and duration <= 0:
        raise click.BadParameter("must be positive", param_hint="--duration")
    mode: report.Mode = "rate" if rate is not None else "concurrency"
    levels = tuple(map(float, rate or concurrency or DEFAULT_CONCURRENCY))
    if duration is None and requests is None:
        duration = 10.0
    if metrics_url is None:
        metrics_url = url.rstrip("/") + "/metrics"
    spec = workload.WorkloadSpec(
        protocol=protocol,
        payload=payload,
        model_name=model_name or DEFAULT_MODEL_NAMES[payload],
        input_name=input_name or DEFAULT_INPUT_NAMES[payload],
        input_shape=input_shape,
        text_length=text_length,
        batch_per_request=batch_per_request,
        seed=seed,
    )
    settings = runner.RunSettings(
        url=url,
        mode=mode,
        levels=levels,
        duration=duration,
        requests=requests,
        metrics_url=None if metrics_url == "none" else metrics_url,
        warmup_seconds=warmup,
        timeout_seconds=timeout,
        seed=seed,
        progress=not quiet,
        grpc_target=grpc_target if protocol == "grpc" else None,
    )
    try:
        cells = asyncio.run(runner.run(settings, workload.build(spec)))
    except runner.ServerUnreachable as error:
        raise click.ClickException(str(error)) from None
    result = report.BenchReport(
        settings={
            "url": url,
            "model_name": spec.model_name,
            "protocol": protocol,
            "payload": payload,
            "input_shape": list(spec.input_shape) if payload == "toy" else None,
            "text_length": text_length if payload == "text" else None,
            "batch_per_request": batch_per_request,
            "mode": mode,
            "levels": list(levels),
            "duration_seconds": duration,
            "requests": requests,
            "warmup_seconds": warmup,
            "seed": seed,
        },
        cells=cells,
    )
    click.echo(report.render_text(result))
    if json_path is not None:
        report.write_json(result, json_path)
    if plot_path is not None:
        report.plot({spec.model_name: cells}, plot_path, title=f"carpool bench: {url}")
    unanswered = [
        report.level_label(cell.mode, cell.level)
        for cell in cells
        if cell.requests and cell.ok == 0
    ]
    if unanswered:
        # Errors at a level some requests got through are figures; none at all is a failure.
        # (A level that sent nothing, an open loop whose arrivals fell past its duration,
        # failed at nothing.)
        raise click.ClickException(f"no request succeeded at {', '.join(unanswered)}")
