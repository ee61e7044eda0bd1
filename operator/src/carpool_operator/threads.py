"""torch's intra-op threads: one per whole CPU core the model server is given.

torch starts a thread per core of the node, whatever the container's CPU limit; with a limit
of 1 core on a 64-core node the threads fight over one core's quota and get throttled. The
request (which the operator also sets as the limit) in whole cores, at least one, avoids that.
"""

from __future__ import annotations

from decimal import Decimal


def cores(cpu: str) -> Decimal:
    """A CPU quantity as the CRD allows it ("2", "1.5", "500m") in cores."""
    if cpu.endswith("m"):
        return Decimal(cpu[:-1]) / 1000
    return Decimal(cpu)


def torch_threads(cpu: str, override: int | None) -> int:
    """spec.model.torchThreads when set, else the CPU request's whole cores, at least 1."""
    if override is not None:
        return override
    return max(1, int(cores(cpu)))
