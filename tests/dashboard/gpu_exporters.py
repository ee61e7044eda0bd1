"""Stand-ins for CUDA model servers: each serves fixed GPU memory gauges on `/metrics`.

    with gpu_exporters("toy", "cuda:0", allocated=[1e9, 3e9]) as targets:
        ...  # targets: ["127.0.0.1:PORT", ...], one exporter per value

A model server on a CPU-only machine has no GPU gauges, so the GPU memory panel cannot be fed by
the real one here. Each exporter reports `allocated` bytes allocated and twice that reserved,
in the model server's metric names and labels (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from support.prometheus import static_exporter

RESERVED_PER_ALLOCATED = 2


def exposition(model: str, device: str, allocated: float) -> bytes:
    labels = f'model="{model}",device="{device}"'
    reserved = allocated * RESERVED_PER_ALLOCATED
    return (
        "# TYPE carpool_model_gpu_memory_allocated_bytes gauge\n"
        f"carpool_model_gpu_memory_allocated_bytes{{{labels}}} {allocated}\n"
        "# TYPE carpool_model_gpu_memory_reserved_bytes gauge\n"
        f"carpool_model_gpu_memory_reserved_bytes{{{labels}}} {reserved}\n"
    ).encode()


@contextmanager
def gpu_exporters(model: str, device: str, allocated: Sequence[float]) -> Iterator[list[str]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(static_exporter(exposition(model, device, v))) for v in allocated
        ]
