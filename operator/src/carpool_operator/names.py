"""carpool's names in the Kubernetes API: the BatchedModel's group, version, kind and plural,
as the CRD (crds/batchedmodels.carpool.dev.yaml) declares them, and the domain of the
operator's own annotations and finalizer."""

from __future__ import annotations

from typing import Final

GROUP: Final = "carpool.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "BatchedModel"
PLURAL: Final = "batchedmodels"
# The CRD's file name, as Kubernetes names a CRD object.
CRD_FILE: Final = f"{PLURAL}.{GROUP}.yaml"
# Annotations and the finalizer the operator writes sit under the API group's domain.
DOMAIN: Final = GROUP
