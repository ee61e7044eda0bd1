"""How a pod stops without dropping requests: a delay while its endpoints go, then a drain.

When a pod starts terminating, Kubernetes removes it from the Service's endpoints, but
kube-proxy, ingresses and clients learn of it only seconds later and keep sending. So for
spec.shutdown.drainDelaySeconds after SIGTERM the sidecar keeps accepting (while reporting not
ready), then stops accepting and drains what it holds. The model server gets its SIGTERM as
late, through a preStop sleep, so it keeps serving the sidecar throughout; its own drain then
lasts while batches still come. The grace period covers the delay, the drain and a margin.
"""

from __future__ import annotations

from carpool_operator.types import Manifest

DEFAULT_DRAIN_DELAY_S = 10


def pre_stop(delay_s: int) -> Manifest:
    """A lifecycle that holds the container's SIGTERM for `delay_s` (none when 0)."""
    if delay_s == 0:
        return {}
    # The kubelet's own sleep: no shell or binary needed in the image.
    return {"preStop": {"sleep": {"seconds": delay_s}}}


def grace_period(delay_s: int, drain_s: int, margin_s: int) -> int:
    return delay_s + drain_s + margin_s
