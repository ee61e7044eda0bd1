"""The init container that fetches spec.model.weights.storageUri into the pod's weights folder.

It runs `python -m carpool.storage` from the model's own image, so the pod pulls one image and
the downloader (fsspec and the stores' libraries) ships with carpool. The Secret named by
weights.secretName is mounted at CREDENTIALS_PATH in the fetcher alone: its keys named like
variables (AWS_ACCESS_KEY_ID, HF_TOKEN, ...) become the fetcher's own environment, the others
stay files (GCS: GOOGLE_APPLICATION_CREDENTIALS=<CREDENTIALS_PATH>/key.json and the key file).
Nothing of it is in the pod's spec or reaches the model server.
"""

from __future__ import annotations

from carpool_operator.types import Manifest

CONTAINER_NAME = "fetch-weights"
CREDENTIALS_VOLUME = "weights-credentials"
CREDENTIALS_PATH = "/var/run/secrets/carpool/weights"


def storage_fetcher(
    *, image: str, uri: str, mount_path: str, secret_name: str, resources: Manifest
) -> Manifest:
    container: Manifest = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": ["python", "-m", "carpool.storage", uri, mount_path],
        # The image keeps the model server offline; the fetcher is the one part that may
        # reach the Hugging Face Hub.
        "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}],
        "resources": resources,
        # Its last log lines (the reason of a failed download) become the pod's message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "weights", "mountPath": mount_path},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if secret_name:
        container["command"] += ["--credentials", CREDENTIALS_PATH]
        mount = {"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_PATH, "readOnly": True}
        container["volumeMounts"].append(mount)
    return container


def storage_volumes(secret_name: str) -> list[Manifest]:
    """The pod volumes the fetcher needs besides the weights folder itself."""
    if not secret_name:
        return []
    return [{"name": CREDENTIALS_VOLUME, "secret": {"secretName": secret_name}}]
