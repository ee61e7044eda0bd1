"""The container's termination message: why the model server stopped, in `kubectl describe pod`.

When a container exits, the kubelet reads the file at its terminationMessagePath (by default
/dev/termination-log, which it mounts into the container) and shows it as the container's
last state; the operator reads it from there too. Outside a pod the file does not exist and
nothing is written: creating it would litter /dev.
"""

from __future__ import annotations

import logging
from pathlib import Path

DEFAULT_PATH = Path("/dev/termination-log")
# The kubelet keeps at most this many bytes of the message.
LIMIT_BYTES = 4096

log = logging.getLogger("carpool_model_server")


def write_termination_message(message: str, path: Path = DEFAULT_PATH) -> None:
    """Replace the termination message with `message`, if the file is there to hold it."""
    data = message.encode()[:LIMIT_BYTES]
    try:
        with path.open("r+b") as file:
            file.truncate()
            file.write(data)
    except FileNotFoundError:
        return
    except OSError as error:
        log.warning("cannot write the termination message to %s: %s", path, error)
