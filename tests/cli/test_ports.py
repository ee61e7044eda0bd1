"""`carpool.ports`: a port another server holds is seen as taken, and as not ours."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from carpool.ports import listens, taken
from carpool.processes import free_port


def test_a_listening_port_is_taken_and_belongs_to_its_listener_alone() -> None:
    port = free_port()
    assert taken("127.0.0.1", port) is None
    assert not listens(os.getpid(), port)
    with socket.create_server(("127.0.0.1", port)):
        assert taken("127.0.0.1", port) == "Address already in use"
        assert listens(os.getpid(), port)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not listens(other.pid, port)
        finally:
            other.kill()
            other.wait()
    assert taken("127.0.0.1", port) is None


def test_a_connection_that_lingers_does_not_make_a_port_taken() -> None:
    # The sidecar binds with SO_REUSEADDR: a port whose connections are in TIME_WAIT is free.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: it keeps the TIME_WAIT
        client.close()
    assert taken("127.0.0.1", port) is None


def test_a_host_that_is_no_address_is_said_so() -> None:
    assert "not an address" in str(taken("no-such-host.invalid", 8080))


def test_free_port_never_hands_out_one_port_twice() -> None:
    # A fixture's port and the next server's were once the same one: the kernel offered
    # the released port again, and the second server could not bind.
    ports = [free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports)
