"""How long a batch of b items takes, learned online as fixed + per_item * b."""

from __future__ import annotations

from dataclasses import dataclass

# Weight of a new sample once a size has a few: the estimate follows a drifting model (another
# process on the core, a warmed cache) within some twenty batches.
ALPHA = 0.1
# A sample counts at most this many times its size's estimate (or this fraction of it): one
# stall (a GC pause, a noisy neighbour) moves the estimate by a bounded step, not by its length.
CLIP = 2.0
# Sizes seen this often weigh fully in the line; rarer sizes count for less.
FULL_WEIGHT = 16


@dataclass(slots=True)
class _Size:
    seconds: float
    count: int


class DurationFit:
    """Per batch size a clipped running mean of measured durations, and the line through them
    (weighted by how often each size was seen), which extrapolates to sizes not seen yet."""

    def __init__(self) -> None:
        self._sizes: dict[int, _Size] = {}
        self.fixed_s = 0.0
        self.per_item_s = 0.0
        self.mean_size = 0.0  # of the sizes seen, weighted as in the line: where it is surest

    @property
    def known(self) -> bool:
        return bool(self._sizes)

    def record(self, size: int, seconds: float) -> None:
        entry = self._sizes.get(size)
        if entry is None:
            self._sizes[size] = _Size(seconds, 1)
        else:
            sample = min(max(seconds, entry.seconds / CLIP), entry.seconds * CLIP)
            entry.count += 1
            # A plain mean of the first samples, then an exponential one.
            entry.seconds += max(1 / entry.count, ALPHA) * (sample - entry.seconds)
        self._fit()

    def predict(self, size: int) -> float:
        return self.fixed_s + self.per_item_s * size

    def _fit(self) -> None:
        """Weighted least squares; neither part may be negative."""
        weights = [
            (size, entry.seconds, min(entry.count, FULL_WEIGHT))
            for size, entry in self._sizes.items()
        ]
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
