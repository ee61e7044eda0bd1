"""The operator's idle cost: API requests per model per resync period, on the test API server.

    .venv/bin/python bench/operator_idle.py --models 1000 --minutes 10

Starts the test API server (tests/support/kube_api.py), applies the CRD and `--models` small
models, runs the real operator (`--resync-seconds`, 60 by default, as in production), waits
until every model has a status and the operator has written nothing for `--settle-seconds`,
then counts the operator's requests (its own client's and kopf's) for `--minutes` and prints
them per model per resync period, with the paths asked most. Run it with PYTHONPATH pointing
at another checkout's operator/src to measure that operator instead (docs/operator.md has the
figures before and after the cache).
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

import click

# The test API server and its helpers live with the tests; bench/ is a folder of scripts.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.idle_models import create_models, operator_requests, reported
from support.kube_api import ServedKubeApi, parse_target
from support.kube_cluster import CRD, OPERATOR_AGENT, Cluster, run_operator


@click.command()
@click.option("--models", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--minutes", type=click.FloatRange(min=0.1), default=10.0, show_default=True)
@click.option("--resync-seconds", type=click.FloatRange(min=0.1), default=60.0, show_default=True)
@click.option("--settle-seconds", type=click.FloatRange(min=0), default=30.0, show_default=True)
def main(models: int, minutes: float, resync_seconds: float, settle_seconds: float) -> None:
    """Count what `--models` idle models cost over `--minutes`."""
    with tempfile.TemporaryDirectory() as folder, ServedKubeApi() as served:
        cluster = Cluster(served.write_kubeconfig(Path(folder) / "kubeconfig"), "default")
        cluster.kubectl("apply", "-f", str(CRD))
        create_models(cluster, [f"idle-{index}" for index in range(models)])
        log = Path(folder) / "operator.log"
        with run_operator(cluster.kubeconfig, "default", log, resync_seconds=resync_seconds):
            started = time.monotonic()
            cluster.wait_for("every status", lambda: reported(cluster) == models, timeout=3600)
            writes, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < settle_seconds:
                time.sleep(1)
                if (now := served.api.write_count(agent=OPERATOR_AGENT)) != writes:
                    writes, quiet_since = now, time.monotonic()
            click.echo(f"{models} models reported and settled in {time.monotonic() - started:.0f}s")
            start = len(served.api.records)
            time.sleep(minutes * 60)
            asked = operator_requests(served.api, start)
    periods = minutes * 60 / resync_seconds
    click.echo(
        f"{len(asked)} requests in {minutes:g} min ({periods:g} resync periods of "
        f"{resync_seconds:g}s): {len(asked) / models / periods:.3f} per model per period, "
        f"{len(asked) / (minutes * 60):.2f} per second"
    )
    kinds = collections.Counter(_what(request) for request in asked)
    for what, count in kinds.most_common(8):
        click.echo(f"  {count:>8}  {what}")


def _what(request: str) -> str:
    """`GET deployments (one)` or `GET pods (all)`, from `GET /apis/...`."""
    method, path = request.split(" ", 1)
    target = parse_target(path)
    if target is None or not target.plural:
        return f"{method} {path}"
    return f"{method} {target.plural} ({'one' if target.name else 'all'})"


if __name__ == "__main__":
    main()
