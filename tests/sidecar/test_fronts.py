"""`--front-processes 2`: two front processes serve REST for one engine (real processes)."""

from __future__ import annotations

import asyncio
import functools
import signal
import socket
import subprocess
from pathlib import Path

import aiohttp
import orjson
import psutil
from support.model_server import SUPPORT_DIR
from support.sidecar import Sidecar, get, infer, metric, run_pair, v2_body, wait_for

from carpool import processes
from carpool.processes import free_port

FRONTS = ("--front-processes", "2")
SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.3"}


def fronts(sidecar: Sidecar) -> list[psutil.Process]:
    return psutil.Process(sidecar.process.pid).children()


def connections(front: psutil.Process) -> int:
    """The front's established TCP connections (the clients it serves)."""
    return sum(1 for c in front.connections("tcp") if c.status == psutil.CONN_ESTABLISHED)


def listening(front: psutil.Process) -> bool:
    """Whether the front listens: its socket is in the port's group, taking connections."""
    return any(c.status == psutil.CONN_LISTEN for c in front.connections("tcp"))


async def v1_predict(http: aiohttp.ClientSession, sidecar: Sidecar, row: list[float]) -> object:
    url = f"{sidecar.url}/v1/models/{sidecar.model}:predict"
    async with http.post(url, json={"instances": [row]}) as reply:
        assert reply.status == 200, await reply.text()
        return (await reply.json())["predictions"]


async def test_many_clients_are_answered_and_batched_across_fronts(tmp_path: Path) -> None:
    # Fixed dispatch waits for a full batch of 16, more than either front holds clients.
    args = (*FRONTS, "--max-batch-size", "16", "--dispatch", "fixed", "--max-wait-ms", "5000")
    with run_pair(tmp_path, "toy", *args) as pair:
        sidecar = pair.sidecar
        assert len(fronts(sidecar)) == 2
        sessions = [aiohttp.ClientSession() for _ in range(16)]
        try:
            calls = [infer(http, sidecar, [[n, n, n, n]]) for n, http in enumerate(sessions)]
            results = await asyncio.gather(*calls)
            for n, (status, body) in enumerate(results):
                assert status == 200, body
                assert body["outputs"][0]["data"] == [2 * n + 1] * 4
            held = [connections(front) for front in fronts(sidecar)]
            # The kernel spread the 16 connections over both fronts, each holding fewer
            # clients than the batch had.
            assert sorted(held)[0] >= 1 and sum(held) == 16, held
            assert metric(sidecar, "carpool_batches_total", reason="full") == 1
            assert metric(sidecar, "carpool_batch_size_sum") == 16
            # KServe v1 takes the same way.
            v1 = [v1_predict(http, sidecar, [n, 0, 0, 0]) for n, http in enumerate(sessions)]
            assert await asyncio.gather(*v1) == [[[2 * n + 1, 1, 1, 1]] for n in range(16)]
        finally:
            for http in sessions:
                await http.close()
        # Every request counts once in one scrape, whichever front served it or the scrape.
        for _ in range(4):
            assert metric(sidecar, "carpool_requests_total", protocol="rest", code="200") == 32
        assert metric(sidecar, "carpool_request_duration_seconds_count", protocol="rest") == 32
        assert metric(sidecar, "carpool_batches_total", reason="full") == 2


async def test_overload_refusals_and_bad_requests_come_from_every_front(tmp_path: Path) -> None:
    args = (*FRONTS, "--max-batch-size", "1", "--max-inflight-batches", "1")
    args += ("--max-queue-items", "2")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *args, env=SLOW) as pair:
        sidecar = pair.sidecar
        sessions = [aiohttp.ClientSession() for _ in range(8)]
        try:
            calls = [infer(http, sidecar, [[1, 2, 3, 4]]) for http in sessions]
            statuses = sorted(status for status, _ in await asyncio.gather(*calls))
            bad = await infer(sessions[0], sidecar, [[1, 2, 3]])
        finally:
            for http in sessions:
                await http.close()
        # Two queued, one of them perhaps at the model already (more if some came after others
        # were answered); the rest refused at once: the one engine's queue was full.
        refused = statuses.count(429)
        assert statuses.count(200) >= 2 and refused >= 1, statuses
        assert statuses == [200] * (8 - refused) + [429] * refused, statuses
        assert bad[0] == 400 and "shape" in bad[1]["error"], bad
        assert metric(sidecar, "carpool_rejected_total", reason="queue_full") == refused
        assert metric(sidecar, "carpool_requests_total", protocol="rest", code="429") == refused


async def test_settings_file_reaches_every_front(tmp_path: Path) -> None:
    settings = tmp_path / "batching.json"
    settings.write_bytes(orjson.dumps({"maxQueueItems": 2}))
    args = (*FRONTS, "--config-file", str(settings), "--latency-objective-ms", "60000")
    with run_pair(tmp_path, "toy", *args) as pair:
        sidecar = pair.sidecar
        three = [[1, 2, 3, 4]] * 3
        async with aiohttp.ClientSession() as http:
            # Each front checks a request's size against maxQueueItems before it is sent.
            for _ in range(4):
                status, body = await infer(http, sidecar, three)
                assert status == 413, body
            settings.write_bytes(orjson.dumps({"maxQueueItems": 8}))
            await asyncio.to_thread(
                wait_for, lambda: asyncio.run(_status(sidecar, three)) == 200, 10.0
            )
            for _ in range(4):
                status, body = await infer(http, sidecar, three)
                assert status == 200, body
        # The pod's objective once, not once per process; its goodput counted by the fronts.
        assert metric(sidecar, "carpool_latency_objective_seconds") == 60.0
        answered = metric(sidecar, "carpool_requests_total", protocol="rest", code="200")
        assert answered >= 5
        assert metric(sidecar, "carpool_requests_within_objective_total") == answered


async def _status(sidecar: Sidecar, rows: list[list[float]]) -> int:
    async with aiohttp.ClientSession() as http:
        return (await infer(http, sidecar, rows))[0]


async def test_sigterm_drains_every_front_with_nothing_lost(tmp_path: Path) -> None:
    args = (*FRONTS, "--max-batch-size", "2", "--max-inflight-batches", "1")
    args += ("--drain-seconds", "20", "--drain-delay-seconds", "0.5")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *args, env=SLOW) as pair:
        sidecar = pair.sidecar
        children = fronts(sidecar)
        sessions = [aiohttp.ClientSession() for _ in range(10)]
        try:
            calls = [
                asyncio.create_task(infer(http, sidecar, [[n, n, n, n]]))
                for n, http in enumerate(sessions)
            ]
            await asyncio.to_thread(wait_for, lambda: metric(sidecar, "carpool_queue_items") >= 6)
            sidecar.process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(wait_for, lambda: get(sidecar, "/v2/health/ready")[0] == 503)
            # Not ready, but still serving through the drain delay, closing each connection.
            url = f"{sidecar.url}/v2/models/toy/infer"
            async with sessions[0].post(url, json=v2_body([[1, 1, 1, 1]])) as reply:
                assert reply.status == 200
                assert reply.headers["Connection"] == "close"
            results = await asyncio.gather(*calls)
        finally:
            for http in sessions:
                await http.close()
        for n, (status, body) in enumerate(results):
            assert status == 200, body
            assert body["outputs"][0]["data"] == [2 * n + 1] * 4
        assert sidecar.process.wait(15) == 0, sidecar.log()
        assert not any(child.is_running() for child in children)


async def test_a_killed_front_is_replaced_and_fronts_die_with_the_sidecar(
    tmp_path: Path,
) -> None:
    with run_pair(tmp_path, "toy", *FRONTS) as pair:
        sidecar = pair.sidecar
        victim, _ = fronts(sidecar)
        victim.kill()
        await asyncio.to_thread(
            wait_for, lambda: len(fronts(sidecar)) == 2 and victim not in fronts(sidecar)
        )
        # New connections land on both sockets, the replaced front's too: all answered.
        for _ in range(3):
            sessions = [aiohttp.ClientSession() for _ in range(8)]
            try:
                results = await asyncio.gather(
                    *(infer(http, sidecar, [[1, 2, 3, 4]]) for http in sessions)
                )
            finally:
                for http in sessions:
                    await http.close()
            assert [status for status, _ in results] == [200] * 8
        assert "starting another" in sidecar.log()
        children = fronts(sidecar)
        sidecar.process.kill()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, alive


async def test_connections_while_a_front_waits_to_restart_go_to_the_live_front(
    tmp_path: Path,
) -> None:
    with run_pair(tmp_path, "toy", *FRONTS) as pair:
        sidecar = pair.sidecar
        # A front that dies four times in a row waits 2 s (0.25 s doubled) for its restart.
        survivor, victim = fronts(sidecar)

        def restarts(count: int) -> bool:
            return sidecar.log().count("starting another") == count

        for deaths in range(1, 5):
            victim.kill()
            await asyncio.to_thread(wait_for, functools.partial(restarts, deaths))
            if deaths < 4:
                await asyncio.to_thread(wait_for, lambda: len(fronts(sidecar)) == 2)
                (victim,) = set(fronts(sidecar)) - {survivor}
        assert fronts(sidecar) == [survivor]

        async def timed(http: aiohttp.ClientSession) -> float:
            start = asyncio.get_running_loop().time()
            status, body = await infer(http, sidecar, [[1, 2, 3, 4]])
            assert status == 200, body
            return asyncio.get_running_loop().time() - start

        sessions = [aiohttp.ClientSession() for _ in range(20)]  # a connection each
        try:
            # Each new connection is answered by the live front at once, none left waiting
            # in the dead front's backlog until the restart.
            waits = await asyncio.gather(*(timed(http) for http in sessions))
            assert max(waits) < 1.0, [round(w, 2) for w in sorted(waits)]
            # The restarted front takes its share of new connections again.
            await asyncio.to_thread(wait_for, lambda: len(fronts(sidecar)) == 2)
            (restarted,) = set(fronts(sidecar)) - {survivor}
            await asyncio.to_thread(wait_for, lambda: listening(restarted))
            for http in sessions:
                await http.close()
            sessions = [aiohttp.ClientSession() for _ in range(16)]
            await asyncio.gather(*(timed(http) for http in sessions))
            assert connections(restarted) >= 1
        finally:
            for http in sessions:
                await http.close()


async def test_a_body_over_a_fronts_share_of_the_reading_budget_gets_413(
    tmp_path: Path,
) -> None:
    # Each of two fronts holds half of the 200 kB reading budget: a 300 kB body, under the
    # body limit, could never be read by one; the caller hears so, not "retry shortly".
    args = (*FRONTS, "--max-reading-bytes", "200000", "--max-body-bytes", "400000")
    with run_pair(tmp_path, "toy", *args) as pair:
        body = orjson.dumps(v2_body([[1, 2, 3, 4]])) + b" " * 300_000
        url = f"{pair.sidecar.url}/v2/models/{pair.sidecar.model}/infer"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body) as reply:
                assert reply.status == 413, await reply.text()
            assert (await infer(http, pair.sidecar, [[1, 2, 3, 4]]))[0] == 200


async def test_counts_stay_whole_when_fronts_are_killed_and_restarted(tmp_path: Path) -> None:
    with run_pair(tmp_path, "toy", *FRONTS) as pair:
        sidecar = pair.sidecar
        sessions = [aiohttp.ClientSession() for _ in range(8)]
        try:
            for http in sessions:
                assert (await infer(http, sidecar, [[1, 2, 3, 4]]))[0] == 200
            assert (await infer(sessions[0], sidecar, [[1, 2, 3]]))[0] == 400
        finally:
            for http in sessions:
                await http.close()
        assert metric(sidecar, "carpool_requests_total", protocol="rest", code="200") == 8
        victims = fronts(sidecar)
        for victim in victims:
            victim.kill()
        await asyncio.to_thread(
            wait_for, lambda: len(set(fronts(sidecar)) - set(victims)) == 2, 10.0
        )
        # A counter that fell would read to Prometheus as a reset: every count since the
        # start added again to its rate.
        assert metric(sidecar, "carpool_requests_total", protocol="rest", code="200") == 8
        assert metric(sidecar, "carpool_requests_total", protocol="rest", code="400") == 1
        assert metric(sidecar, "carpool_rejected_total", reason="bad_request") == 1
        assert metric(sidecar, "carpool_request_duration_seconds_count", protocol="rest") == 9
        async with aiohttp.ClientSession() as http:
            assert (await infer(http, sidecar, [[1, 2, 3, 4]]))[0] == 200
        assert metric(sidecar, "carpool_requests_total", protocol="rest", code="200") == 9


async def test_sigterm_while_a_front_waits_to_restart_leaves_the_drain_serving(
    tmp_path: Path,
) -> None:
    args = (*FRONTS, "--drain-delay-seconds", "3")
    with run_pair(tmp_path, "toy", *args) as pair:
        sidecar = pair.sidecar
        fronts(sidecar)[0].kill()
        await asyncio.to_thread(wait_for, lambda: "starting another" in sidecar.log())
        sidecar.process.send_signal(signal.SIGTERM)  # within the 0.25 s before the restart
        await asyncio.to_thread(wait_for, lambda: "not ready; serving" in sidecar.log())
        await asyncio.sleep(1.0)  # past the restart's time
        # Still in the drain delay: the front left serves, live, and answers what comes.
        assert get(sidecar, "/v2/health/live")[0] == 200, sidecar.log()
        async with aiohttp.ClientSession() as http:
            status, body = await infer(http, sidecar, [[1, 2, 3, 4]])
        assert status == 200, body
        assert sidecar.process.wait(15) == 0, sidecar.log()
        assert "ended early" not in sidecar.log()


def test_a_port_another_process_shares_is_taken_not_split(tmp_path: Path) -> None:
    # Another sidecar's fronts hold the port with SO_REUSEPORT: joining their group would
    # split the callers between two sidecars.
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = str(holder.getsockname()[1])
        command = processes.carpool_command("sidecar", "--model-name", "toy", *FRONTS)
        command += ["--model-server", "unix:///nonexistent.sock", "--port", held]
        command += ["--grpc-port", str(free_port())]
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1, done.stderr
    assert f"Error: cannot listen on 127.0.0.1:{held}" in done.stderr
