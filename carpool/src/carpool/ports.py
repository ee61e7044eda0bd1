"""The TCP ports of `carpool serve`: free before it starts, and its own sidecar's once ready.

A readiness probe cannot tell servers apart: on a port another server holds, that server's
200 would read as our sidecar's. So the ports are checked before anything starts, and
readiness counts only while the sidecar itself listens on them (Linux: `/proc`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

# /proc/net/tcp* columns: a socket's local address is HEXIP:HEXPORT, LISTEN is state 0A.
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"


def taken(host: str, port: int) -> str | None:
    """Why `port` cannot be listened on at `host` now (another server has it), or None.

    Binds as the sidecar does (SO_REUSEADDR: a port whose last connections linger in
    TIME_WAIT counts as free), on every address `host` names, then lets go.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        return f"{host} is not an address: {error.strerror}"
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                return error.strerror or str(error)
    return None


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a listening TCP socket on `port`; True where the system
    keeps no `/proc` to tell."""
    if not _TABLES[0].exists():
        return True
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # gone
    for descriptor in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{descriptor}") in sockets:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in _TABLES:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue  # no IPv6
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rpartition(":")[2], 16) == port:
                inodes.add(inode)
    return inodes
