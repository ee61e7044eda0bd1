"""What asking for a GPU changes in a pod: the CUDA image, the runtime and the fail-fast flag.

A CPU-only torch in a pod that holds a GPU would quietly serve on the CPU, so a model with
resources.gpu > 0 gets the CUDA image unless its spec names one, and its model server is told
to refuse to start without a CUDA device (`--require-gpu`).
"""

from __future__ import annotations

from carpool_operator.defaults import Defaults


def model_image(given: str, defaults: Defaults, gpu: int) -> str:
    """The spec's image, else the operator's CUDA image for GPU models, else its CPU image."""
    if given:
        return given
    return defaults.cuda_image if gpu > 0 else defaults.image


def runtime_class_name(given: str, defaults: Defaults, gpu: int) -> str:
    """The spec's RuntimeClass, else the operator's GPU runtime for GPU models, else none.

    Where nvidia is not the node's default container runtime (k3s, some kubeadm set-ups) a GPU
    pod needs the `nvidia` RuntimeClass to see its device.
    """
    if given:
        return given
    return defaults.runtime_class_name if gpu > 0 else ""
