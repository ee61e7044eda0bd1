"""How many CPUs the pod may use: what sizes the preprocess pool.

The smaller of the CPUs this process may run on (its affinity, as a cpuset gives it) and
its cgroup v2 CPU quota (`cpu.max`, from the container's CPU limit) rounded up: a
container limited to 2 CPUs on a 64-core node gets 2, not 64.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def pod_cpus(cpu_max: Path = CPU_MAX) -> int:
    """At least 1."""
    count = len(os.sched_getaffinity(0))
    quota = _quota(cpu_max)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def _quota(cpu_max: Path) -> float | None:
    """CPUs the cgroup may use, from `cpu.max` ("quota period", or "max period"); None when
    unlimited or unreadable."""
    try:
        quota, _, period = cpu_max.read_text().partition(" ")
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None  # "max": no limit; no cgroup v2 file: nothing to go by
