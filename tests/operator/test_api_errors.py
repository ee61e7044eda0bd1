"""Which answers of the API server the operator retries, and how soon."""

from __future__ import annotations

import itertools

import pytest

from carpool_operator.kube import FIRST_RETRY_S, MAX_RETRY_S, ApiError

# An apply the API server cannot type, as a real one answers it: 500, no reason.
UNTYPABLE = (
    "failed to create typed patch object (default/m; apps/v1, Kind=Deployment): "
    '.spec.template.spec.containers[name="model-server"].env: duplicate entries for key '
    '[name="A"]'
)


@pytest.mark.parametrize(
    ("status", "reason", "message", "transient"),
    [
        (500, "", UNTYPABLE, False),
        (422, "Invalid", 'Deployment.apps "m" is invalid: spec.replicas: Invalid value', False),
        (400, "BadRequest", "the body is not an object", False),
        (500, "InternalError", "Internal error occurred: etcdserver: request timed out", True),
        (503, "ServiceUnavailable", "the server is currently unable to handle the request", True),
        (504, "Timeout", "the server was unable to return a response in the time allotted", True),
        (409, "Conflict", "the object has been modified", True),
        (429, "TooManyRequests", "the server has received too many requests", True),
        (403, "Forbidden", 'deployments.apps "m" is forbidden', True),
        (401, "Unauthorized", "Unauthorized", True),
    ],
)
def test_only_what_a_retry_may_fix_is_retried(
    status: int, reason: str, message: str, transient: bool
) -> None:
    assert ApiError(status, reason, message).transient is transient


def test_retries_back_off_to_a_ceiling() -> None:
    delays = [ApiError(503, "", "").retry_delay(retry) for retry in range(100)]
    assert delays[0] == FIRST_RETRY_S
    assert all(later >= sooner for sooner, later in itertools.pairwise(delays))
    assert delays[3] == 8 * FIRST_RETRY_S
    assert max(delays) == delays[-1] == MAX_RETRY_S
    # Throttling and a refusal of permission start slower.
    assert ApiError(429, "", "").retry_delay(0) > FIRST_RETRY_S
    # A write lost to another since the read (an apply's resourceVersion precondition) is
    # judged again within a second, once the cache has the news.
    assert ApiError(409, "Conflict", "").retry_delay(0) <= 1.0
    assert ApiError(409, "Conflict", "").retry_delay(100) == MAX_RETRY_S
