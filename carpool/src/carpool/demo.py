"""`carpool serve --demo-load`: a short bounded concurrent load through a running sidecar.

It is one closed-loop cell of `carpool bench` with one-item requests: real sentences when
the model takes text, small tensors otherwise. The report shows the mean batch size the
sidecar formed, read from its own /metrics, so it shows batching at work.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp

from carpool.loadgen import runner, workload
from carpool.loadgen.report import CellResult


def workload_for(metadata: dict[str, Any]) -> workload.WorkloadSpec:
    """Requests for the model's first input, as its metadata describes it."""
    first = metadata["inputs"][0]
    if first["datatype"] == "BYTES":
        return workload.WorkloadSpec(
            payload="text", model_name=metadata["name"], input_name=first["name"]
        )
    # The metadata's first dimension is the batch; a variable one becomes 8 elements.
    shape = tuple(8 if dim == -1 else int(dim) for dim in first["shape"][1:])
    return workload.WorkloadSpec(
        payload="toy", model_name=metadata["name"], input_name=first["name"], input_shape=shape
    )


async def run_demo(
    url: str, model: str, clients: int, seconds: float, max_requests: int
) -> CellResult:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v2/models/{model}") as reply:
        reply.raise_for_status()
        metadata = await reply.json()
    settings = runner.RunSettings(
        url=url,
        mode="concurrency",
        levels=(clients,),
        duration=seconds,
        requests=max_requests,
        metrics_url=f"{url}/metrics",
        warmup_seconds=0,
        progress=False,
    )
    (cell,) = await runner.run(settings, workload.build(workload_for(metadata)))
    return cell


def report_lines(cell: CellResult) -> list[str]:
    failed = cell.requests - cell.ok
    lines = [
        f"requests:        {cell.requests} ({failed} failed) in {cell.wall_seconds:.1f} s",
        f"throughput:      {cell.throughput_rps:.1f} requests/s",
        f"latency:         p50 {cell.latency.p50 * 1000:.1f} ms, "
        f"p99 {cell.latency.p99 * 1000:.1f} ms",
    ]
    if cell.batching is not None:
        mean = cell.batching.mean_items_per_batch
        reasons = ", ".join(
            f"{reason} {count:g}"
            for reason, count in sorted(cell.batching.batches_by_reason.items())
        )
        lines.append(f"mean batch size: {mean if math.isfinite(mean) else 0:.2f}")
        lines.append(f"batches sent:    {reasons or 'none'}")
    return lines
