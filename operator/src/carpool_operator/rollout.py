"""How a BatchedModel's Deployment replaces its pods: spec.rollout, with GPU-aware defaults.

Kubernetes' default (25% surge) starts an extra pod before stopping an old one. On a GPU pool
that is full, which is the normal state of an expensive pool, that pod never schedules and the
rollout stalls; so GPU models default to stopping one pod first (surge 0, unavailable 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from carpool_operator.types import Manifest

# int-or-string, as in a Deployment: a pod count or a percentage such as "25%".
Amount = int | str

GPU_DEFAULT: tuple[Amount, Amount] = (0, 1)
# Kubernetes' own defaults, rendered only when the spec sets the other half.
CPU_DEFAULT: tuple[Amount, Amount] = ("25%", "25%")


@dataclass(frozen=True)
class Rollout:
    """maxSurge and maxUnavailable; both None leaves the Deployment's strategy to Kubernetes."""

    max_surge: Amount | None = None
    max_unavailable: Amount | None = None


def _amount(value: Any) -> Amount:
    return value if isinstance(value, int) else str(value)


def parse_rollout(section: Mapping[str, Any], gpu: int) -> Rollout:
    surge, unavailable = section.get("maxSurge"), section.get("maxUnavailable")
    if surge is None and unavailable is None and gpu == 0:
        return Rollout()
    default_surge, default_unavailable = GPU_DEFAULT if gpu > 0 else CPU_DEFAULT
    return Rollout(
        max_surge=default_surge if surge is None else _amount(surge),
        max_unavailable=default_unavailable if unavailable is None else _amount(unavailable),
    )


def strategy(rollout: Rollout) -> Manifest | None:
    """The Deployment's spec.strategy, or None to keep Kubernetes' default."""
    if rollout.max_surge is None or rollout.max_unavailable is None:
        return None
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {
            "maxSurge": rollout.max_surge,
            "maxUnavailable": rollout.max_unavailable,
        },
    }
