"""`stand-in`: an accelerator's timing without the accelerator, for tests and benchmarks.

Its forward pass sleeps `fixed_ms + item_ms * b` for a batch of b items. The sleep releases
the GIL as a wait for GPU kernels does, so the event loop and the preprocess thread run
meanwhile, and dispatch can be measured on any machine as on the device it stands for:
`preset=fast` is a GPU (2 ms + 0.05 ms per item), `preset=slow` this project's CPU running
all-MiniLM-L6-v2 (40 ms + 4 ms per item). `jitter` spreads each batch's time uniformly by
that fraction either way; with `outliers`, that share of batches takes `outlier_ms` instead,
as a GPU's first run of a shape does. The answer is checkable: output = 2 * input + 1.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.handler import (
    Handler,
    HandlerSettings,
    Prepared,
    joined,
    output_rows,
    require_inputs,
)

# Any length per item, as toy payloads ([4]) and longer ones; bounded like a real input.
INPUT = TensorSpec("input", "FP32", (-1,), max_elements=1 << 16)
OUTPUT = TensorSpec("output", "FP32", (-1,))


@dataclass(frozen=True, slots=True)
class Timing:
    """What one batch costs; every field is a `--handler-options` key."""

    fixed_ms: float = 0.0
    item_ms: float = 0.0
    jitter: float = 0.0  # a fraction of the batch's time, either way
    outliers: float = 0.0  # share of batches that take outlier_ms instead
    outlier_ms: float = 1000.0
    seed: float = 0.0  # of the draws of jitter and outliers: runs repeat

    def seconds(self, size: int, draw: random.Random) -> float:
        if self.outliers and draw.random() < self.outliers:
            return self.outlier_ms / 1000
        spread = 1 + self.jitter * (2 * draw.random() - 1) if self.jitter else 1.0
        return (self.fixed_ms + self.item_ms * size) * spread / 1000


PRESETS: Mapping[str, Timing] = {
    "fast": Timing(fixed_ms=2.0, item_ms=0.05),
    "slow": Timing(fixed_ms=40.0, item_ms=4.0),
}
KEYS = ("preset", *(field.name for field in fields(Timing)))


def timing_of(options: Mapping[str, str]) -> Timing:
    """The timing `options` ask for: a preset (none: no time at all), then single keys over
    it; ValueError names a bad value."""
    preset = options.get("preset", "")
    if preset and preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    timing = PRESETS[preset] if preset else Timing()
    values: dict[str, float] = {}
    for key, text in options.items():
        if key == "preset":
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{key} must be a number, got {text!r}") from None
        bounded = value <= 1 if key in ("jitter", "outliers") else value < 3_600_000
        if not (value >= 0 and bounded):
            raise ValueError(f"{key} is out of range, got {text!r}")
        values[key] = value
    return replace(timing, **values)


@dataclass(frozen=True, slots=True)
class Rows:
    """A batch: every item's elements one after another, and each item's shape."""

    values: np.ndarray
    shapes: list[tuple[int, ...]]


class StandInHandler(Handler[Rows, Rows]):
    metadata = Metadata(
        platform="carpool_stand_in",
        inputs=(INPUT,),
        outputs=(OUTPUT,),
        pads_variable_dims=True,  # items of any length share a batch; nothing is stacked
    )
    options = frozenset(KEYS)

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.timing = timing_of(settings.options)
        self._draw = random.Random(self.timing.seed)

    def load(self, device: torch.device) -> None:
        """No weights: nothing to load."""

    def preprocess(self, items: Sequence[Item]) -> Prepared[Rows]:
        # The whole batch at once: one join, one finiteness check (the items only when it fails).
        tensors, rejected = require_inputs(items, INPUT)
        values = joined(tensors.values(), INPUT.datatype)
        if not np.isfinite(values).all():
            for index, tensor in list(tensors.items()):
                if not np.isfinite(tensor.to_numpy()).all():
                    rejected[index] = f"input {INPUT.name!r} must be finite"
                    del tensors[index]
            values = joined(tensors.values(), INPUT.datatype)
        if not tensors:
            return Prepared(None, 0, rejected)
        shapes = [tensor.shape for tensor in tensors.values()]
        return Prepared(Rows(values, shapes), len(shapes), rejected)

    def infer(self, batch: Rows) -> Rows:
        time.sleep(self.timing.seconds(len(batch.shapes), self._draw))
        return Rows(batch.values * 2 + 1, batch.shapes)

    def postprocess(self, outputs: Rows) -> list[dict[str, Tensor]]:
        return output_rows(OUTPUT.name, outputs.values, outputs.shapes)

    def example_item(self) -> Item:
        return {INPUT.name: Tensor.from_numpy(np.zeros(4, dtype=np.float32))}
