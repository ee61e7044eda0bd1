"""Searching batching settings for the most throughput whose latency meets an objective.

A trial measures one point of the space (a value per knob). `coordinate_search` starts from
one point and, knob by knob, measures every value of that knob with the others held, moves
to the best, and repeats the round until a round moves nothing (at most `rounds`): on the
default space about one trial in twelve of the full grid's, which `full_grid` measures for
comparison. Batching knobs interact little once the others are sensible (the batch size and
in-flight batches set the throughput, the wait and the dispatch mode mostly the latency), so
a coordinate search lands at or near the grid's best.

Points compare (`better`) first by meeting the objective (the latency at the percentile,
refusals counted as misses, within it), then by throughput, where throughputs within TIE of
each other are one throughput and the lower latency wins: a measurement is noisy, and
under an open load every point that keeps up serves the same rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

# Throughputs within this fraction of each other count as equal.
TIE = 0.03

Point = tuple[int, ...]  # an index into each dimension's values
Value = float | str


@dataclass(frozen=True, slots=True)
class Dimension:
    key: str  # the knob's file key (spec.batching)
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Space:
    dimensions: tuple[Dimension, ...]

    def settings(self, point: Point) -> dict[str, Value]:
        """The knobs of a point, by file key."""
        return {
            dimension.key: dimension.values[index]
            for dimension, index in zip(self.dimensions, point, strict=True)
        }

    def nearest(self, settings: Mapping[str, Value]) -> Point:
        """The point closest to `settings` (a knob's own value, else its nearest, else the
        first)."""
        return tuple(
            _nearest(dimension, settings.get(dimension.key)) for dimension in self.dimensions
        )

    def size(self) -> int:
        total = 1
        for dimension in self.dimensions:
            total *= len(dimension.values)
        return total


@dataclass(frozen=True, slots=True)
class Trial:
    settings: dict[str, Value]
    throughput: float  # answered requests per second
    latency_s: float  # at the percentile, refusals and errors counted as misses (inf)
    requests: int
    answered: int
    seconds: float  # the trial's own time, settling included


def meets(trial: Trial, objective_s: float) -> bool:
    return trial.latency_s <= objective_s


def better(one: Trial, other: Trial, objective_s: float) -> bool:
    """Whether `one` is the better setting of the two."""
    if meets(one, objective_s) != meets(other, objective_s):
        return meets(one, objective_s)
    if not meets(one, objective_s):
        return one.latency_s < other.latency_s  # neither: the nearer to the objective
    if abs(one.throughput - other.throughput) > TIE * max(one.throughput, other.throughput):
        return one.throughput > other.throughput
    return one.latency_s < other.latency_s


def best(trials: Sequence[Trial], objective_s: float) -> Trial:
    winner = trials[0]
    for trial in trials[1:]:
        if better(trial, winner, objective_s):
            winner = trial
    return winner


def frontier(trials: Sequence[Trial]) -> list[Trial]:
    """The trials no other beats on both throughput and latency, by latency."""
    finite = sorted((t for t in trials if t.latency_s != float("inf")), key=lambda t: t.latency_s)
    shown: list[Trial] = []
    for trial in finite:
        if not shown or trial.throughput > shown[-1].throughput:
            shown.append(trial)
    return shown


Measure = Callable[[Point], Awaitable[Trial]]


async def coordinate_search(
    space: Space, start: Point, measure: Measure, objective_s: float, rounds: int = 2
) -> list[Trial]:
    """The trials of a coordinate search from `start`, in the order measured."""
    measured: dict[Point, Trial] = {}

    async def trial(point: Point) -> Trial:
        if point not in measured:
            measured[point] = await measure(point)
        return measured[point]

    current = start
    await trial(current)
    for _ in range(rounds):
        moved = False
        for axis, dimension in enumerate(space.dimensions):
            line = [
                (*current[:axis], index, *current[axis + 1 :])
                for index in range(len(dimension.values))
            ]
            winner = current
            for point in line:
                if better(await trial(point), measured[winner], objective_s):
                    winner = point
            moved |= winner != current
            current = winner
        if not moved:
            break
    return list(measured.values())


def grid(space: Space) -> Iterator[Point]:
    return itertools.product(*(range(len(dimension.values)) for dimension in space.dimensions))


async def full_grid(space: Space, measure: Measure) -> list[Trial]:
    return [await measure(point) for point in grid(space)]


def _nearest(dimension: Dimension, value: Value | None) -> int:
    if value in dimension.values:
        return dimension.values.index(value)
    if isinstance(value, int | float) and all(isinstance(v, int | float) for v in dimension.values):
        distances = [abs(float(v) - value) for v in dimension.values]
        return distances.index(min(distances))
    return 0
