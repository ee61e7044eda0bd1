"""Callers who never read their answers, beside one who does, then a SIGTERM with one more.

One implementation for the quick test (`test_unread_answers.py`) and the soak
(`bench/soak.py unread_answers`). Each slow reader opens a connection with a small receive
buffer, sends a binary request whose answer is several MB, and never reads: the answer
stays with the sidecar unless it lets go of it. A good client calls meanwhile; a thread
samples the sidecar's RSS. At the end one more slow reader is left hanging on a sidecar
that gets SIGTERM: the drain must still end on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import sys
import time
from asyncio.subprocess import PIPE
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import orjson
from reliability.traffic import Outcome, RssPeak, call, gauge, good_client, rows_for, rss_bytes
from support.model_server import SUPPORT_DIR
from support.sidecar import Pair, Sidecar, run_pair

GRPC_READER = Path(__file__).with_name("grpc_reader.py")
# Large buffers always mapped, and unmapped when freed: glibc otherwise raises its threshold
# as they come and go, and keeps freed ones for reuse, and RSS would not show a drop.
RSS_FOLLOWS_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


@dataclass(frozen=True)
class Plan:
    readers: int = 8  # slow readers at once
    elements: int = 2_000_000  # FP32 per request, one item: 8 MB in, 8 MB of raw answer
    idle_s: float = 1.0  # --body-timeout-seconds
    drain_delay_s: float = 0.5
    drain_seconds: float = 3.0
    hold_s: float = 6.0  # how long the slow readers read nothing, beyond twice idle_s
    seed: int = 5


@dataclass
class Report:
    answer_bytes: int = 0
    rss_before: int = 0
    rss_peak: int = 0
    rss_held: int = 0  # at the end of the hold, before the slow readers read
    rss_after: int = 0
    never_cut: int = 0  # connections still open, their answer sent whole, after the hold
    good: list[Outcome] = field(default_factory=list)
    # "UNAVAILABLE": cut; "OK": the whole answer had left for the socket before the stop
    grpc_endings: list[str] = field(default_factory=list)
    grpc_rss_held: int = 0  # above the REST phase's baseline, while they were stopped
    grpc_unsent: float = 0.0  # carpool_unsent_answer_bytes then
    unsent_held: float = 0.0  # the same, while the REST callers read nothing
    exit_code: int | None = None
    exit_seconds: float = 0.0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


def request_bytes(elements: int, host: str, model: str) -> bytes:
    """One item of `elements` FP32 for the wide model, answered raw."""
    data = np.zeros(elements, dtype="<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, elements],
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(header) + len(data)}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    )
    return head.encode() + header + data


def wide_pair(folder: Path, *sidecar_args: str) -> AbstractContextManager[Pair]:
    """The wide model behind a sidecar whose RSS follows what it holds."""
    return run_pair(
        folder,
        "model_handlers:WideHandler",
        *sidecar_args,
        env={"PYTHONPATH": str(SUPPORT_DIR)},
        sidecar_env=RSS_FOLLOWS_MEMORY,
    )


def slow_reader(sidecar: Sidecar, body: bytes) -> socket.socket:
    """A connection that sends its request and then reads nothing."""
    host, port = sidecar.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(body)
    return sock


def cut(sock: socket.socket) -> bool:
    """Whether the sidecar had closed the connection: it ends within a second of reading
    what the sidecar had sent, where an answer it kept would arrive whole and leave the
    connection open for the next request."""
    sock.settimeout(1.0)
    try:
        while sock.recv(1 << 20):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report(answer_bytes=plan.elements * 4)
    args = (
        *("--body-timeout-seconds", str(plan.idle_s), "--timeout-ms", "60000"),
        *("--drain-delay-seconds", str(plan.drain_delay_s)),
        *("--drain-seconds", str(plan.drain_seconds)),
    )
    # The wide model answers the good client's toy rows as the toy model does.
    with wide_pair(folder, *args) as pair:
        sidecar = pair.sidecar
        body = request_bytes(plan.elements, "127.0.0.1", sidecar.model)
        pid = sidecar.process.pid
        async with aiohttp.ClientSession() as http:
            await call(http, sidecar, rows_for(random.Random(0), 2), 10)  # warm
            done = asyncio.Event()
            with RssPeak(pid) as rss:
                readers = [slow_reader(sidecar, body) for _ in range(plan.readers)]
                good = asyncio.create_task(good_client(http, sidecar, plan.seed, done, report.good))
                # The answers take a few seconds to compute and send what the buffers take;
                # then each must not outlive the body timeout by much.
                await asyncio.sleep(plan.hold_s + 2 * plan.idle_s)
                report.rss_held = rss_bytes(pid)
                report.unsent_held = await gauge(sidecar, "carpool_unsent_answer_bytes")
                done.set()
                outcomes = await asyncio.gather(*(asyncio.to_thread(cut, sock) for sock in readers))
                report.never_cut = outcomes.count(False)
                for sock in readers:
                    sock.close()
                await good
                await asyncio.sleep(0.5)
                report.rss_after = rss_bytes(pid)
            report.rss_before, report.rss_peak = rss.before, rss.peak
    await _grpc_readers(folder, plan, report)
    await _sigterm_with_a_reader(folder, plan, body, report)
    return report


async def _grpc_readers(folder: Path, plan: Plan, report: Report) -> None:
    """The same over gRPC: callers whose processes stop (SIGSTOP) once their call is sent."""
    args = (
        *("--body-timeout-seconds", str(plan.idle_s), "--timeout-ms", "60000"),
        *("--grpc-max-message-bytes", str(2 * report.answer_bytes)),
    )
    with wide_pair(folder, *args) as pair:
        sidecar = pair.sidecar
        command = [str(GRPC_READER), sidecar.grpc, str(plan.elements)]
        readers = [
            await asyncio.create_subprocess_exec(sys.executable, *command, stdout=PIPE)
            for _ in range(plan.readers)
        ]
        try:
            for reader in readers:
                assert reader.stdout is not None
                line = await reader.stdout.readline()
                assert line.strip() == b"sent", line
                _signal(reader, signal.SIGSTOP)
            await asyncio.sleep(plan.hold_s + 2 * plan.idle_s)
            report.grpc_rss_held = rss_bytes(sidecar.process.pid) - report.rss_before
            report.grpc_unsent = await gauge(sidecar, "carpool_unsent_answer_bytes")
        finally:
            for reader in readers:
                _signal(reader, signal.SIGCONT)
        for reader in readers:
            out, _ = await asyncio.wait_for(reader.communicate(), 60)
            report.grpc_endings.append(out.decode().split()[-1] if out.split() else "nothing")


def _signal(reader: asyncio.subprocess.Process, signum: int) -> None:
    # One whose whole answer came before the signal has read it and gone.
    with contextlib.suppress(ProcessLookupError):
        reader.send_signal(signum)


async def _sigterm_with_a_reader(folder: Path, plan: Plan, body: bytes, report: Report) -> None:
    """SIGTERM while an answer nobody reads is being written, with a body timeout too long
    to cut it first: only the drain's end can."""
    args = (
        *("--body-timeout-seconds", "60", "--timeout-ms", "60000"),
        *("--drain-delay-seconds", str(plan.drain_delay_s)),
        *("--drain-seconds", str(plan.drain_seconds)),
    )
    with wide_pair(folder, *args) as pair:
        sidecar = pair.sidecar
        reader = slow_reader(sidecar, body)
        try:
            await asyncio.sleep(3.0)  # answered, its first bytes sent, the rest waiting
            started = time.monotonic()
            sidecar.process.send_signal(signal.SIGTERM)
            try:
                report.exit_code = await asyncio.to_thread(sidecar.process.wait, 30)
            finally:
                report.exit_seconds = time.monotonic() - started
        finally:
            reader.close()


def summary(report: Report, plan: Plan) -> str:
    slowest_good = max((o.seconds for o in report.good), default=0.0)
    return (
        f"{plan.readers} slow readers of {report.answer_bytes >> 20} MiB answers: "
        f"{plan.readers - report.never_cut} cut, {report.never_cut} kept open; sidecar RSS "
        f"{report.rss_before >> 20} MiB, peak {report.rss_peak >> 20} MiB, "
        f"{report.rss_held >> 20} MiB while they read nothing, {report.rss_after >> 20} MiB "
        f"after, {report.unsent_held:.0f} bytes unsent; over gRPC {sorted(report.grpc_endings)}, "
        f"RSS +{report.grpc_rss_held >> 20} MiB and {report.grpc_unsent:.0f} bytes unsent while "
        f"stopped; good client {len(report.good)} calls, statuses "
        f"{sorted({o.status for o in report.good}, key=str)}, slowest {slowest_good:.2f} s; "
        f"SIGTERM with one more: exit {report.exit_code} after {report.exit_seconds:.2f} s"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    if report.never_cut:
        broken.append(f"{report.never_cut} connections that read nothing were kept open")
    # Each request holds its body, its results and its answer at once, for a while.
    unread = plan.readers * report.answer_bytes
    if report.rss_peak - report.rss_before > 6 * unread + (64 << 20):
        broken.append(
            f"RSS grew {(report.rss_peak - report.rss_before) >> 20} MiB for "
            f"{unread >> 20} MiB of unread answers"
        )
    for when, rss in (("while they read nothing", report.rss_held), ("after", report.rss_after)):
        if rss - report.rss_before > 64 << 20:
            broken.append(f"RSS {(rss - report.rss_before) >> 20} MiB up {when}")
    if report.unsent_held or report.grpc_unsent:
        broken.append(
            f"answers of cut callers still held: REST {report.unsent_held:.0f} bytes, "
            f"gRPC {report.grpc_unsent:.0f} bytes"
        )
    # gRPC core keeps freed frames for reuse (RSS does not fall back); what the sidecar
    # holds for the stopped callers must still be less than their answers, many times over.
    if report.grpc_rss_held > 3 * unread + (64 << 20):
        broken.append(
            f"RSS {report.grpc_rss_held >> 20} MiB up while {plan.readers} gRPC callers "
            f"of {unread >> 20} MiB read nothing"
        )
    bad = [o for o in report.good if o.status != 200 or not o.correct]
    if bad:
        broken.append(f"the good client got {[(o.status, o.error) for o in bad[:3]]}")
    promised = plan.drain_delay_s + plan.drain_seconds + 1.0
    if report.exit_code != 0 or report.exit_seconds > promised:
        broken.append(
            f"SIGTERM exit {report.exit_code} after {report.exit_seconds:.2f} s, "
            f"promised 0 within {promised:.1f} s"
        )
    return broken
