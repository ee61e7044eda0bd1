"""`carpool tune`: search a live sidecar's batching settings for the most throughput whose
latency at a percentile meets an objective, at a given load.

    carpool serve --handler stand-in --handler-options preset=slow --config-file /tmp/b.json &
    carpool tune --settings-file /tmp/b.json --objective-ms 200 --rate 150 \\
        --snippet batching.yaml --plot frontier.png

The sidecar must read its settings from the file given (`--config-file`, in a pod the
ConfigMap's batching.json): each trial writes its settings there and the sidecar takes them
without a restart. At the end the file holds the best settings found.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import click
import orjson

from carpool.comma_list import CommaList
from carpool.contract.batching import DISPATCH_MODES, KNOB_BY_KEY, Batching
from carpool.loadgen import runner, workload
from carpool.loadgen.main import DEFAULT_INPUT_NAMES, DEFAULT_MODEL_NAMES, timeout_option
from carpool.report_path import ReportPath
from carpool.tune import output, search
from carpool.tune.trial import Load, NotApplied, SettingsFile, Trials, until_applied

# The knobs the search moves, and the values it tries of each unless told.
SEARCHED: dict[str, str] = {
    "maxBatchSize": "4,8,16,32,64",
    "maxWaitMs": "0,2,5,10",
    "dispatch": ",".join(DISPATCH_MODES),
    "maxInflightBatches": "1,2,4",
}
F = TypeVar("F", bound=Callable[..., Any])


def _searched_options(function: F) -> F:
    """A list of values per searched knob, with the knob's flag and the contract's range; whole
    numbers only, as spec.batching takes them (the snippet is one)."""
    for key, default in reversed(SEARCHED.items()):
        knob = KNOB_BY_KEY[key]
        values = (
            click.Choice(knob.choices)
            if knob.choices
            else click.IntRange(knob.minimum, knob.maximum)
        )
        option = click.option(
            knob.flag, knob.attribute, type=CommaList(values), default=default, show_default=True
        )
        function = option(function)
    return function


@click.command()
@click.option("--url", default="http://127.0.0.1:8080", show_default=True, help="The sidecar.")
@click.option(
    "--settings-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The sidecar's --config-file, which each trial rewrites.",
)
@click.option("--objective-ms", type=click.FloatRange(min=0, min_open=True), required=True)
@click.option(
    "--percentile",
    type=click.FloatRange(0, 100, min_open=True),
    default=99.0,
    show_default=True,
    help="The latency held to the objective; refused and failed requests count as misses.",
)
@click.option("--concurrency", type=click.IntRange(min=1), help="Closed loop: this many clients.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="Poisson requests/s.")
@click.option("--duration", type=float, default=5.0, show_default=True, help="Seconds per trial.")
@click.option("--warmup", type=float, default=1.0, show_default=True, help="Unrecorded seconds.")
@timeout_option
@_searched_options
@click.option("--grid", is_flag=True, help="Measure every point, not a coordinate search.")
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--model-name", default=None, help="[default: the payload's built-in handler]")
@click.option("--payload", type=click.Choice(["text", "toy"]), default="toy", show_default=True)
@click.option(
    "--text-length", type=click.Choice(workload.TEXT_LENGTHS), default="mixed", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--snippet", type=ReportPath(), help="Write spec.batching (YAML).")
@click.option("--plot", "plot_path", type=ReportPath(), help="The frontier, PNG.")
@click.option("--json", "json_path", type=ReportPath(), help="Every trial.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def command(
    url: str,
    settings_file: Path,
    objective_ms: float,
    percentile: float,
    concurrency: int | None,
    rate: float | None,
    duration: float,
    warmup: float,
    timeout: float,
    grid: bool,
    rounds: int,
    model_name: str | None,
    payload: Literal["text", "toy"],
    text_length: workload.TextLength,
    seed: int,
    snippet: Path | None,
    plot_path: Path | None,
    json_path: Path | None,
    quiet: bool,
    **searched: tuple[search.Value, ...],
) -> None:
    """Find the batching settings with the most throughput whose latency meets an objective."""
    if (concurrency is None) == (rate is None):
        raise click.UsageError("give --concurrency or --rate, one of them")
    if duration <= 0:
        raise click.BadParameter("must be positive", param_hint="--duration")
    space = search.Space(
        tuple(search.Dimension(key, searched[KNOB_BY_KEY[key].attribute]) for key in SEARCHED)
    )
    try:
        file = SettingsFile(settings_file)
    except (ValueError, orjson.JSONDecodeError) as error:
        raise click.ClickException(f"{settings_file}: {error}") from None
    load = Load(
        mode="rate" if rate is not None else "concurrency",
        level=rate if rate is not None else float(concurrency or 1),
        duration_s=duration,
        warmup_s=warmup,
        percentile=percentile,
        seed=seed,
        timeout_s=timeout,
    )
    spec = workload.WorkloadSpec(
        protocol="oip-json",
        payload=payload,
        model_name=model_name or DEFAULT_MODEL_NAMES[payload],
        input_name=DEFAULT_INPUT_NAMES[payload],
        input_shape=(4,),
        text_length=text_length,
        batch_per_request=1,
        seed=seed,
    )
    objective_s = objective_ms / 1000
    try:
        trials = asyncio.run(
            _search(url, space, file, load, not quiet, grid, rounds, objective_s, spec)
        )
    except (runner.ServerUnreachable, NotApplied) as error:
        raise click.ClickException(str(error)) from None
    winner = search.best(trials, objective_s)
    file.write(winner.settings)
    click.echo(output.table(trials, winner, load, objective_s))
    text = output.snippet(winner, load, objective_s)
    click.echo(text)
    if snippet is not None:
        snippet.write_text(text)
    if json_path is not None:
        json_path.write_bytes(output.to_json(trials, winner, load, objective_s))
    if plot_path is not None:
        output.plot(trials, winner, load, objective_s, plot_path)
    if not search.meets(winner, objective_s):
        # Reported in full, yet a failure: a script must not take the nearest for a winner.
        raise click.ClickException(
            f"no setting met the objective; the nearest is above, in {settings_file}"
        )


async def _search(
    url: str,
    space: search.Space,
    file: SettingsFile,
    load: Load,
    progress: bool,
    grid: bool,
    rounds: int,
    objective_s: float,
    spec: workload.WorkloadSpec,
) -> list[search.Trial]:
    start = space.nearest(Batching().as_file())
    # A coordinate search's first round, as the progress bar's guess of its length.
    first_round = 1 + sum(len(dimension.values) - 1 for dimension in space.dimensions)
    connector = aiohttp.TCPConnector(
        limit=max(int(load.level), 1) if load.mode == "concurrency" else 1024
    )
    timeout = aiohttp.ClientTimeout(total=load.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await runner.check_answers(session, url)
        send = runner.make_sender(session, url, workload.build(spec))
        trials = Trials(
            space,
            file,
            send,
            load,
            functools.partial(
                until_applied, session, f"{url.rstrip('/')}/v2/models/{spec.model_name}/batching"
            ),
            progress,
            lambda: space.size() if grid else max(first_round, trials.done),
        )
        if grid:
            return await search.full_grid(space, trials.measure)
        return await search.coordinate_search(space, start, trials.measure, objective_s, rounds)
