"""What a spec names but CEL cannot see: the Secrets its environment reads.

A missing Secret would leave every new pod in CreateContainerConfigError; the operator says so
in the status instead, and rolls nothing out until the Secret exists.
"""

from __future__ import annotations

from carpool_operator.kube import ApiError, KubeClient
from carpool_operator.spec import ModelSpec, SpecError


def _secrets(spec: ModelSpec) -> list[tuple[str, str]]:
    """(where, Secret name) of every required Secret the model server's env reads."""
    found: list[tuple[str, str]] = []
    for index, item in enumerate(spec.env):
        reference = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
        if reference.get("name") and not reference.get("optional", False):
            found.append((f"spec.model.env[{index}] ({item.get('name')})", reference["name"]))
    return found


async def check_references(kube: KubeClient, spec: ModelSpec) -> None:
    """Raise SpecError("SecretNotFound") for a required Secret that does not exist.

    Without the RBAC to read Secrets (a hand-made setup may leave it out) nothing is checked:
    the pods' own CreateContainerConfigError then shows in the status.
    """
    for where, name in _secrets(spec):
        try:
            present = await kube.exists("Secret", spec.namespace, name)
        except ApiError as error:
            if error.status == 403:
                return
            raise
        if not present:
            raise SpecError(
                "SecretNotFound", f"{where} reads Secret {name!r}, which {spec.namespace} lacks"
            )
