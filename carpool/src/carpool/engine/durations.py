"""How long a batch of b items takes, learned online as fixed + per_item * b, per length bucket.

Every estimate is robust to outliers, such as a GPU's first run of a shape, a GC pause or a
noisy neighbour: one sample has bounded influence. Per batch size the estimate is the median
of its samples of the last HORIZON_S, or of its last few where it has fewer (one outlier moves
it by one rank); the line rests on sizes seen twice at least (a lone sample is unconfirmed:
the first batch of a process may take a second), each weighed by how many of its samples are
that recent, and until there are such it is flat at the shortest time seen (a batch predicted
short leaves early and waits at the model server, which costs little; one predicted long
leaves the model idle); and the first sample of a size is held within CLIP of what the line
predicts for it.

A model slows down when other work takes the cores and speeds up when they are given back,
and under load only a few sizes run: so the line follows the sizes seen lately, and a size
not seen for HORIZON_S counts for little (STALE of a recent sample per sample), giving the
line its slope where the recent sizes do not. Ages are counted to the newest batch, so an
idle spell forgets nothing. Each size's median still needs a few batches of that size, so
the line is scaled by the pace of the last PACE_BATCHES batches, whatever their sizes: the
median of each one's time against what the line says for its size (1 once the line has
caught up), which follows a model that slows or speeds as a whole within a few batches.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Hashable

# Samples per size the median is taken over.
WINDOW = 8
# How far back a size's samples are recent: a model's changed speed is learned in about this.
HORIZON_S = 1.0
# Samples per size the median rests on at least, recent or not.
LEAST = 3
# What one sample of a size not seen for HORIZON_S weighs in the line, against a recent one.
STALE = 1 / 256
# The first sample of a size counts at most this many times what the line predicts for it
# (or this fraction of it), once the line is known.
CLIP = 2.0
# The last batches, of any size, whose pace against the line scales it: the median of 3
# follows a change in two, and one stalled batch moves it one rank.
PACE_BATCHES = 3
# BucketedFit's marks of which buckets its batches were of.
_NONE_YET = object()
_MIXED = object()


def lower_median(samples: list[float]) -> float:
    """Of two middle ones, the lower: an estimate that errs short sends the next batch early,
    where it waits at the model server, while one that errs long leaves the model idle."""
    ordered = sorted(samples)
    return ordered[(len(ordered) - 1) // 2]


class RecentMedian:
    """The lower median of the last `window` samples."""

    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=window)
        self.value = 0.0

    def add(self, sample: float) -> None:
        self._samples.append(sample)
        self.value = lower_median(list(self._samples))


class SizeSamples:
    """One batch size's last WINDOW samples, with when each was taken."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=WINDOW)
        self.count = 0
        self.value = 0.0
        self.weight = 0.0
        self._until = -math.inf  # the newest batch time up to which `value` and `weight` hold

    def add(self, seconds: float, at: float) -> None:
        self._samples.append((at, seconds))
        self.count += 1
        self._until = -math.inf

    def refresh(self, newest: float) -> None:
        """`value` and `weight` as of the newest batch (of any size) at `newest`."""
        if newest <= self._until:
            return
        since = newest - HORIZON_S
        recent = [seconds for at, seconds in self._samples if at > since]
        samples = list(self._samples)
        chosen = recent if len(recent) >= LEAST else [seconds for _, seconds in samples[-LEAST:]]
        self.value = lower_median(chosen)
        self.weight = len(recent) + STALE * (len(samples) - len(recent))
        # Unchanged until the oldest recent sample ages out.
        self._until = min((at for at, _ in samples if at > since), default=math.inf)
        self._until += HORIZON_S


class DurationFit:
    """Per batch size the median of recent durations, and the line through them (weighted by
    how many recent samples each size has), which extrapolates to sizes not seen yet."""

    def __init__(self) -> None:
        self._sizes: dict[int, SizeSamples] = {}
        self._confirmed = False  # some size was seen twice
        self.fixed_s = 0.0
        self.per_item_s = 0.0
        self.mean_size = 0.0  # of the sizes seen, weighted as in the line: where it is surest
        self._newest = -float("inf")  # when the newest batch ended
        self._line = (0.0, 0.0)  # fixed and per item, before the pace
        self._last: deque[tuple[int, float]] = deque(maxlen=PACE_BATCHES)  # size, seconds

    @property
    def known(self) -> bool:
        return bool(self._sizes)

    @property
    def confirmed(self) -> bool:
        """Whether the line rests on a size seen twice, not on lone samples."""
        return self._confirmed

    def covers(self, size: int | None) -> bool:
        """Whether the line rests on this size (None: any size), or on more than one size."""
        return size in self._sizes or len(self._sizes) > 1

    def record(self, size: int, seconds: float, at: float) -> None:
        """A batch of `size` items took `seconds`, ending `at` (time.monotonic)."""
        entry = self._sizes.get(size)
        if entry is None:
            if self._confirmed:
                expected = self.predict(size)
                seconds = min(max(seconds, expected / CLIP), expected * CLIP)
            entry = self._sizes[size] = SizeSamples()
        entry.add(seconds, at)
        self._newest = max(self._newest, at)
        self._last.append((size, seconds))
        self._line = self._fit()
        self._pace()

    def predict(self, size: int) -> float:
        return self.fixed_s + self.per_item_s * size

    def _pace(self) -> None:
        """The line scaled by the median of the last batches' times against it."""
        fixed, per_item = self._line
        ratios = [
            seconds / line for size, seconds in self._last if (line := fixed + per_item * size) > 0
        ]
        pace = lower_median(ratios) if ratios else 1.0
        self.fixed_s, self.per_item_s = pace * fixed, pace * per_item

    def _fit(self) -> tuple[float, float]:
        """The line, fixed and per item: weighted least squares; neither part may be
        negative."""
        for entry in self._sizes.values():
            entry.refresh(self._newest)
        confirmed = [(size, entry) for size, entry in self._sizes.items() if entry.count > 1]
        self._confirmed = bool(confirmed)
        if not confirmed:
            shortest = min(self._sizes, key=lambda size: self._sizes[size].value)
            self.mean_size = shortest
            return self._sizes[shortest].value, 0.0
        # One pass (this runs after every batch): the weighted sums of x, y, x*x and x*y.
        total = sx = sy = sxx = sxy = 0.0
        for x, entry in confirmed:
            w, y = entry.weight, entry.value
            total += w
            sx += w * x
            sy += w * y
            sxx += w * x * x
            sxy += w * x * y
        self.mean_size = sx / total
        spread = total * sxx - sx * sx
        slope = (total * sxy - sx * sy) / spread if spread > 1e-12 else 0.0
        if slope <= 0:
            # One size seen, or sizes that do not tell cost apart: a flat duration.
            return sy / total, 0.0
        intercept = (sy - slope * sx) / total
        if intercept < 0:
            # Through the origin: all cost grows with the batch.
            return 0.0, sxy / sxx
        return intercept, slope


class BucketedFit:
    """A DurationFit per length bucket (where items pad to the bucket, their length sets the
    cost), and one over every batch for buckets not learned yet. While every batch was of
    one bucket, that bucket's fit is the pooled one, learned once (at one caller, every
    batch is learned); it becomes a fit of its own when another bucket comes."""

    def __init__(self) -> None:
        self.pooled = DurationFit()
        self._buckets: dict[Hashable, DurationFit] = {}
        # The bucket of every batch so far: _NONE_YET before the first, _MIXED once two differ.
        self._sole: Hashable = _NONE_YET

    @property
    def known(self) -> bool:
        return self.pooled.known

    def record(self, size: int, bucket: Hashable, seconds: float, at: float) -> None:
        if self._sole is _NONE_YET:
            self._sole = bucket
        elif self._sole is not _MIXED and self._sole != bucket:
            if self._sole is not None:
                self._buckets[self._sole] = copy.deepcopy(self.pooled)
            self._sole = _MIXED
        self.pooled.record(size, seconds, at)
        if bucket is not None and self._sole is _MIXED:
            self._buckets.setdefault(bucket, DurationFit()).record(size, seconds, at)

    def fit(self, size: int | None, bucket: Hashable) -> DurationFit:
        """The bucket's own line where it says something of `size` (None: of any size), else
        the pooled one."""
        own = self._buckets.get(bucket)
        return own if own is not None and own.covers(size) else self.pooled

    def predict(self, size: int, bucket: Hashable) -> float:
        return self.fit(size, bucket).predict(size)

    def fixed_s(self, bucket: Hashable) -> float:
        """What a batch of the bucket costs beyond its items."""
        return self.fit(None, bucket).fixed_s
