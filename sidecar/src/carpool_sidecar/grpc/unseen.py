"""Calls that gRPC ends before any of the sidecar's code sees them, counted from gRPC's numbers.

grpc.aio takes calls from gRPC's core one at a time, a few hundred microseconds each; under
a flood the rest wait in the core, where those whose deadline passes, and those its backlog
protection refuses (CANCELLED at once, past about 1,000 waiting), end unseen. Channelz, which
gRPC keeps for every server, counts the calls the server started and the streams open on
each of its connections; the sidecar counts the calls that reached one of its handlers
(`Arrivals`). Started, less open, less arrived, have ended unseen. It is a lower bound, read
in that order (a call that arrives or opens meanwhile only lowers it), so the count grows to
it and never past the truth; it is exact once no call is in flight, and short by at most the
calls the sidecar holds while some are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from prometheus_client import Counter

# grpcio's channelz functions (the ones its grpcio-channelz service reads), untyped: each
# answers a channelz message as JSON, whose integers are strings and whose zeros are left out.
_cygrpc: Any = import_module("grpc._cython.cygrpc")


@dataclass(slots=True)
class Arrivals:
    """Calls that reached one of the sidecar's handlers, whatever their method."""

    count: int = 0


def _get(reader: Any, *args: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(reader(*args))
    return result


def _port(socket_id: int) -> int | None:
    """The port a listening socket was asked for (channelz keeps it as given)."""
    local = _get(_cygrpc.channelz_get_socket, socket_id)["socket"].get("local", {})
    port: int | None = local.get("tcpipAddress", {}).get("port")
    return port


def server_id(port: int) -> int:
    """The channelz id of this process's newest gRPC server listening on `port` (one
    stopped before it may linger until it is collected)."""
    found, start = None, 0
    while True:
        page = _get(_cygrpc.channelz_get_servers, start)
        for server in page.get("server", ()):
            start = int(server["ref"]["serverId"]) + 1
            sockets = server.get("listenSocket", ())
            if any(_port(int(socket["socketId"])) == port for socket in sockets):
                found = start - 1
        if page.get("end", True):
            break
    if found is None:
        raise LookupError(f"no gRPC server of this process listens on port {port}")
    return found


class UnseenCalls:
    """Counts in `counter` the calls the server on `port` ended before its handlers saw them.

    `update` brings the count up to date; the metrics route runs it before each scrape.
    Channelz forgets a server once it has stopped, so the last update comes before that.
    """

    def __init__(self, port: int, arrivals: Arrivals, counter: Counter) -> None:
        self._server = server_id(port)
        self._arrivals = arrivals
        self._counter = counter
        self._counted = 0

    def update(self) -> None:
        server = _get(_cygrpc.channelz_get_server, self._server)["server"]
        started = int(server["data"].get("callsStarted", 0))
        unseen = started - self._open_streams() - self._arrivals.count
        if unseen > self._counted:
            self._counter.inc(unseen - self._counted)
            self._counted = unseen

    def _open_streams(self) -> int:
        streams, start = 0, 0
        while True:
            page = _get(_cygrpc.channelz_get_server_sockets, self._server, start, 0)
            for ref in page.get("socketRef", ()):
                start = int(ref["socketId"]) + 1
                try:
                    data = _get(_cygrpc.channelz_get_socket, start - 1)["socket"]["data"]
                except ValueError:  # closed since the page was read: none of it is open
                    continue
                streams += sum(
                    int(data.get(key, 0)) * sign
                    for key, sign in (
                        ("streamsStarted", 1),
                        ("streamsSucceeded", -1),
                        ("streamsFailed", -1),
                    )
                )
            if page.get("end", True):
                return streams
