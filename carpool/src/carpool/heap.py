"""A server's garbage collection: start-up objects kept out of full passes, young passes rarer.

A full collection walks every object the process holds: with torch imported, some 185,000
of them, which holds the GIL for tens of milliseconds (145 ms measured on this project's
loaded 2-core machine; the sidecar's 55,000 took 26 ms), and stalls every request in flight,
the slowest of them at high load. What a server builds before it serves (modules, the model,
the app) lives as long as the process: frozen once it is ready, later full collections walk
only what serving made since.

A young collection runs whenever the tracked objects alive have grown by a threshold since
the last one (Python's default: 700). The objects of the requests in flight pass 700 many
times a second, and reference counting frees them anyway: in the sidecar those passes cost
9-11 µs per request (docs/benchmarks.md, "Less Python per REST request").
"""

from __future__ import annotations

import gc


def freeze_startup() -> None:
    """Collect what start-up left over, then exempt everything alive from later collections."""
    gc.collect()
    gc.freeze()


# Above the objects a sidecar holds for its requests in flight (at 64 callers, one young
# collection in 20,000 requests at this threshold), so their coming and going starts no
# collection; garbage in cycles waits for at most this many more objects.
SERVING_YOUNG_THRESHOLD = 10_000


def collect_young_less_often() -> None:
    """Raise the youngest generation's threshold to SERVING_YOUNG_THRESHOLD, the older ones
    kept as they are."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(SERVING_YOUNG_THRESHOLD, middle, oldest)


def ready_to_serve() -> None:
    """What a server does to its heap once it is ready: `freeze_startup`, then
    `collect_young_less_often`."""
    freeze_startup()
    collect_young_less_often()
