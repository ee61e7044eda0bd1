"""The model server's startup probe: readiness within the model's load budget.

Loading and warming a model takes from seconds to many minutes, and `/healthz` answers long
before the model is loaded. The startup probe therefore waits on `/readyz`, for at most
spec.model.loadTimeoutSeconds: a load that hangs is restarted once its budget is spent, and
liveness (on `/healthz`) starts only after the model is ready.
"""

from __future__ import annotations

import math

from carpool.contract.pod import MODEL_SERVER_READY_PATH
from carpool_operator.types import Manifest

PERIOD_S = 5
DEFAULT_LOAD_TIMEOUT_S = 600


def startup_probe(load_timeout_s: int, port: str) -> Manifest:
    return {
        "httpGet": {"path": MODEL_SERVER_READY_PATH, "port": port},
        "periodSeconds": PERIOD_S,
        "failureThreshold": max(1, math.ceil(load_timeout_s / PERIOD_S)),
    }
