"""Which objects found at a child's name a BatchedModel takes back (see also test_e2e.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from carpool_operator.adoption import adoptable, collected
from carpool_operator.render import render

BODY = {
    "apiVersion": "carpool.dev/v1alpha1",
    "kind": "BatchedModel",
    "metadata": {"name": "m", "namespace": "default", "uid": "new-uid"},
    "spec": {"model": {"handler": "toy"}},
}
(_, DEPLOYMENT, _) = render(BODY)


def orphan() -> dict[str, Any]:
    """The Deployment as an earlier model `m` left it: carpool's apply, no owner."""
    found = copy.deepcopy(DEPLOYMENT)
    del found["metadata"]["ownerReferences"]
    found["metadata"]["managedFields"] = [
        {"manager": "kubectl-client-side-apply", "operation": "Update"},
        {"manager": "carpool", "operation": "Apply"},
    ]
    return found


def test_an_orphan_of_a_model_of_this_name_is_adopted() -> None:
    assert adoptable(orphan(), DEPLOYMENT)
    # Another owner that does not control it (a backup tool's, say) is no obstacle.
    shared = orphan()
    shared["metadata"]["ownerReferences"] = [{"kind": "Backup", "uid": "b", "name": "nightly"}]
    assert adoptable(shared, DEPLOYMENT)


@pytest.mark.parametrize("case", ["controlled", "another-instance", "unlabelled", "by-hand"])
def test_what_someone_else_has_is_not(case: str) -> None:
    found = orphan()
    metadata = found["metadata"]
    if case == "controlled":
        metadata["ownerReferences"] = [{"kind": "Rollout", "uid": "r", "controller": True}]
    elif case == "another-instance":
        metadata["labels"]["app.kubernetes.io/instance"] = "other"
    elif case == "unlabelled":
        del metadata["labels"]
    else:
        metadata["managedFields"] = metadata["managedFields"][:1]
    assert not adoptable(found, DEPLOYMENT)


def controlled_by(kind: str, name: str, uid: str) -> dict[str, Any]:
    found = orphan()
    reference = {"apiVersion": "carpool.dev/v1alpha1", "kind": kind, "name": name, "uid": uid}
    found["metadata"]["ownerReferences"] = [{**reference, "controller": True}]
    return found


def test_a_deleted_model_of_this_name_has_its_children_collected() -> None:
    assert collected(controlled_by("BatchedModel", "m", "old-uid"), DEPLOYMENT)
    # This very model's, another model's, something else's, nobody's: not on their way out.
    assert not collected(controlled_by("BatchedModel", "m", "new-uid"), DEPLOYMENT)
    assert not collected(controlled_by("BatchedModel", "other", "old-uid"), DEPLOYMENT)
    assert not collected(controlled_by("Rollout", "m", "old-uid"), DEPLOYMENT)
    assert not collected(orphan(), DEPLOYMENT)
