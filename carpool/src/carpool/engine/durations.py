"""How long a batch of b items takes, learned online as fixed + per_item * b, per length bucket.

Every estimate is robust to outliers, such as a GPU's first run of a shape, a GC pause or a
noisy neighbour: one sample has bounded influence. Per batch size the estimate is the median
of the last few samples (one outlier moves it by one rank, and it follows a drifting model
within half a window); the line rests on sizes seen twice at least (a lone sample is
unconfirmed: the first batch of a process may take a second), each weighed by how often it
was seen, and until there are such it is flat at the shortest time seen (a batch predicted
short leaves early and waits at the model server, which costs little; one predicted long
leaves the model idle); and the first sample of a size is held within CLIP of what the line
predicts for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

# Samples per size the median is taken over.
WINDOW = 8
# The first sample of a size counts at most this many times what the line predicts for it
# (or this fraction of it), once the line is known.
CLIP = 2.0
# Sizes seen this often weigh fully in the line; rarer sizes count for less.
FULL_WEIGHT = 16


class RecentMedian:
    """The median of the last `window` samples; of two middle ones, the lower: an estimate
    that errs short sends the next batch early, where it waits at the model server, while one
    that errs long leaves the model idle."""

    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=window)
        self.value = 0.0
        self.count = 0

    def add(self, sample: float) -> None:
        self._samples.append(sample)
        self.count += 1
        ordered = sorted(self._samples)
        self.value = ordered[(len(ordered) - 1) // 2]


class DurationFit:
    """Per batch size the median of recent durations, and the line through them (weighted by
    how often each size was seen), which extrapolates to sizes not seen yet."""

    def __init__(self) -> None:
        self._sizes: dict[int, RecentMedian] = {}
        self._confirmed = False  # some size was seen twice
        self.fixed_s = 0.0
        self.per_item_s = 0.0
        self.mean_size = 0.0  # of the sizes seen, weighted as in the line: where it is surest

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

    def record(self, size: int, seconds: float) -> None:
        entry = self._sizes.get(size)
        if entry is None:
            if self._confirmed:
                expected = self.predict(size)
                seconds = min(max(seconds, expected / CLIP), expected * CLIP)
            entry = self._sizes[size] = RecentMedian()
        entry.add(seconds)
        self._fit()

    def predict(self, size: int) -> float:
        return self.fixed_s + self.per_item_s * size

    def _fit(self) -> None:
        """Weighted least squares; neither part may be negative."""
        confirmed = [(size, entry) for size, entry in self._sizes.items() if entry.count > 1]
        self._confirmed = bool(confirmed)
        if not confirmed:
            shortest = min(self._sizes, key=lambda size: self._sizes[size].value)
            self.fixed_s, self.per_item_s = self._sizes[shortest].value, 0.0
            self.mean_size = shortest
            return
        weights = [(size, entry.value, min(entry.count, FULL_WEIGHT)) for size, entry in confirmed]
        total = sum(w for _, _, w in weights)
        sx = sum(w * x for x, _, w in weights)
        sy = sum(w * y for _, y, w in weights)
        sxx = sum(w * x * x for x, _, w in weights)
        sxy = sum(w * x * y for x, y, w in weights)
        self.mean_size = sx / total
        spread = total * sxx - sx * sx
        slope = (total * sxy - sx * sy) / spread if spread > 1e-12 else 0.0
        if slope <= 0:
            # One size seen, or sizes that do not tell cost apart: a flat duration.
            self.fixed_s, self.per_item_s = sy / total, 0.0
            return
        intercept = (sy - slope * sx) / total
        if intercept < 0:
            # Through the origin: all cost grows with the batch.
            self.fixed_s, self.per_item_s = 0.0, sxy / sxx
            return
        self.fixed_s, self.per_item_s = intercept, slope


class BucketedFit:
    """A DurationFit per length bucket (where items pad to the bucket, their length sets the
    cost), and one over every batch for buckets not learned yet."""

    def __init__(self) -> None:
        self.pooled = DurationFit()
        self._buckets: dict[Hashable, DurationFit] = {}

    @property
    def known(self) -> bool:
        return self.pooled.known

    def record(self, size: int, bucket: Hashable, seconds: float) -> None:
        self.pooled.record(size, seconds)
        if bucket is not None:
            self._buckets.setdefault(bucket, DurationFit()).record(size, seconds)

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
