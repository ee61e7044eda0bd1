"""One trial: settings written to a live sidecar's settings file, then a load, measured.

The sidecar reads its settings file (`--config-file`) every second and uses new settings
from its next batch on, without a restart: a trial writes the file (atomically, its other
keys kept), waits until the sidecar says it uses them (`GET /v2/models/{name}/batching`),
warms up unrecorded, then records a closed loop of `level` clients or a Poisson load of
`level` requests/s.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from carpool.loadgen.loops import LoopResult, Send, closed_loop, open_loop, poisson_arrivals
from carpool.loadgen.progress import Progress
from carpool.loadgen.report import Mode
from carpool.loadgen.runner import REQUEST_TIMEOUT_S
from carpool.tune.search import Point, Space, Trial, Value


@dataclass(frozen=True, slots=True)
class Load:
    mode: Mode
    level: float  # clients, or requests/s
    duration_s: float
    warmup_s: float
    percentile: float  # of the latency held to the objective, 0..100
    seed: int = 0
    # Per request: one unanswered by then counts as failed, and the trial goes on.
    timeout_s: float = REQUEST_TIMEOUT_S


class SettingsFile:
    """The sidecar's settings file: what it held, and writing settings over that."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.original = path.read_bytes() if path.exists() else None
        document = orjson.loads(self.original) if self.original else {}
        if not isinstance(document, dict):
            raise ValueError(f"{path} holds no JSON object")
        self._base: dict[str, object] = document

    def write(self, settings: Mapping[str, Value]) -> None:
        body = orjson.dumps({**self._base, **settings}, option=orjson.OPT_INDENT_2)
        # Whole or not at all: the sidecar may read it at any moment.
        handle, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(handle, "wb") as temporary:
            temporary.write(body + b"\n")
        os.replace(name, self.path)


# The sidecar reads its settings file every second; a file it has not taken by then is one
# it does not read (another path) or refuses (see its log).
APPLY_TIMEOUT_S = 5.0
APPLY_POLL_S = 0.05


class NotApplied(Exception):
    """The sidecar did not take the settings written."""


async def until_applied(
    session: aiohttp.ClientSession, url: str, settings: Mapping[str, Value]
) -> None:
    """Return once the sidecar's batching settings at `url` hold `settings`."""
    deadline = time.monotonic() + APPLY_TIMEOUT_S
    while True:
        async with session.get(url) as reply:
            if reply.status != 200:
                raise NotApplied(
                    f"GET {url} answered {reply.status}: a sidecar older than this carpool "
                    "does not say which settings it uses"
                )
            in_use = (await reply.json())["batching"]
        if all(in_use.get(key) == value for key, value in settings.items()):
            return
        if time.monotonic() >= deadline:
            raise NotApplied(
                f"the sidecar did not take {dict(settings)} within {APPLY_TIMEOUT_S:g} s "
                f"(it uses {in_use}): is the settings file the one it reads (--config-file)? "
                "Its log says why it refused a file."
            )
        await asyncio.sleep(APPLY_POLL_S)


def latency_at(result: LoopResult, percentile: float) -> float:
    """The latency at the percentile (nearest rank), a request not answered 200 counting as
    one that never came (infinite)."""
    latencies = sorted(
        outcome.latency if outcome.status == 200 else math.inf for outcome in result.outcomes
    )
    if not latencies:
        return math.inf
    rank = max(1, math.ceil(percentile / 100 * len(latencies)))
    return latencies[rank - 1]


class Trials:
    """Measures points of `space` against the sidecar behind `send`."""

    def __init__(
        self,
        space: Space,
        settings_file: SettingsFile,
        send: Send,
        load: Load,
        applied: Callable[[Mapping[str, Value]], Awaitable[None]],
        progress: bool,
        planned: Callable[[], int],
    ) -> None:
        self._space = space
        self._file = settings_file
        self._send = send
        self._load = load
        self._applied = applied  # returns once the sidecar uses the settings given
        self._progress = progress
        self._planned = planned  # trials expected in all, for the progress bar's label
        self._rng = random.Random(load.seed)
        self.done = 0

    async def measure(self, point: Point) -> Trial:
        started = time.monotonic()
        settings = self._space.settings(point)
        self._file.write(settings)
        await self._applied(settings)
        load = self._load
        if load.warmup_s > 0:
            await self._run(load.warmup_s, None)
        self.done += 1
        label = " ".join(f"{key}={value}" for key, value in settings.items())
        progress = Progress(
            f"trial {self.done}/{self._planned()} {label}",
            duration=load.duration_s,
            requests=None,
            enabled=self._progress,
        )
        result = await self._run(load.duration_s, progress)
        progress.close(len(result.outcomes))
        answered = sum(outcome.status == 200 for outcome in result.outcomes)
        return Trial(
            settings=settings,
            throughput=answered / result.wall_seconds if result.wall_seconds > 0 else 0.0,
            latency_s=latency_at(result, load.percentile),
            requests=len(result.outcomes),
            answered=answered,
            seconds=time.monotonic() - started,
        )

    async def _run(self, seconds: float, progress: Progress | None) -> LoopResult:
        load = self._load
        on_done = progress.update if progress is not None else _ignore
        if load.mode == "concurrency":
            return await closed_loop(self._send, int(load.level), duration=seconds, on_done=on_done)
        arrivals = poisson_arrivals(load.level, self._rng, duration=seconds)
        return await open_loop(self._send, arrivals, on_done=on_done)


def _ignore(done: int) -> None:
    del done
