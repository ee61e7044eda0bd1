"""A `generate_stream` caller who stops reading, against a real sidecar and a model server
that batches generation token by token (the tiny GPT-2)."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import orjson
from library.test_generate_stream import MODEL, STREAM, model_metric
from support.sidecar import metric, run_pair, wait_for

BODY_TIMEOUT_S = 1.0


def test_a_stream_its_caller_stops_reading_is_cut_after_the_body_timeout(
    tmp_path: Path, tiny_lm_path: Path
) -> None:
    """Every event echoes the request's id (5 MB here, more than a socket holds): a caller
    who reads none fills the socket at the first event, however many tokens a piece
    carries (a model server whose writes fall behind merges them). Its stream is cut once
    a write has waited the body timeout, as a whole answer's is, and what it held of the
    answer budget is given back. (Before, its write waited for as long as the connection
    stayed open, holding its frames.)"""
    model_args = ["--model-path", str(tiny_lm_path), "--device", "cpu", "--warmup-sizes", "1"]
    model_args += ["--handler-options", "batching=continuous"]
    sidecar_args = ("--body-timeout-seconds", str(BODY_TIMEOUT_S))
    with run_pair(
        tmp_path, "text-generation", *sidecar_args, model_args=model_args, model=MODEL
    ) as pair:
        sidecar, server = pair.sidecar, pair.model_server
        body = orjson.dumps({"id": "x" * 5_000_000, "text_input": "the cat", "max_tokens": 8})
        host, port = sidecar.url.removeprefix("http://").split(":")
        with socket.socket() as caller:
            caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            caller.connect((host, int(port)))
            head = f"POST {STREAM} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n"
            caller.sendall(head.encode() + body)
            wait_for(
                lambda: model_metric(server, "carpool_model_streams_total", outcome="done") == 1,
                30.0,
                "the sequence done",
            )
            time.sleep(BODY_TIMEOUT_S)
            wait_for(
                lambda: metric(sidecar, "carpool_requests_total", protocol="rest", code="408"),
                5.0,
                "the stream cut and counted as 408",
            )
            assert metric(sidecar, "carpool_unsent_answer_bytes") == 0
            caller.settimeout(5.0)
            with contextlib.suppress(ConnectionResetError):
                while caller.recv(1 << 16):  # what the socket held, then the cut
                    pass
