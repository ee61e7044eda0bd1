"""`carpool infer`'s output when writing it fails part way (a full disk, a file-size limit),
and the run that resumes it."""

from __future__ import annotations

import io
import resource
import subprocess
import sys
from pathlib import Path

import orjson

from carpool_model_server.results_file import append, header, resume

LINES = 3_000


def run_toy(
    data: Path, output: Path, max_file_bytes: int | None = None
) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if max_file_bytes is not None:  # as a full disk would stop the writes
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    args = ["--input", str(data), "--output", str(output), "--batch-size", "64"]
    command = [sys.executable, "-m", "carpool", "infer", "--handler", "toy", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=150, preexec_fn=limit, check=False
    )


def test_a_write_that_fails_is_one_line_and_the_next_run_finishes_the_file(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"input": [n, 1, 2, 3]}) + b"\n" for n in range(LINES)))
    output = tmp_path / "out.jsonl"
    stopped = run_toy(data, output, max_file_bytes=40_000)
    assert stopped.returncode == 1, stopped.stderr
    assert "Traceback" not in stopped.stderr, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: cannot write --output") and "File too large" in last, last
    assert "run the same command again" in last

    done = run_toy(data, output)
    assert done.returncode == 0, done.stderr
    _, *lines = output.read_bytes().splitlines()
    answers = [orjson.loads(line) for line in lines]
    assert [answer["index"] for answer in answers] == list(range(LINES))
    assert answers[5]["outputs"]["output"] == [11.0, 3.0, 5.0, 7.0]
    assert set(tmp_path.iterdir()) == {data, output}


def test_a_last_line_without_its_newline_is_torn_and_answered_again() -> None:
    # A write stopped just before a line's newline leaves whole JSON: appending after it
    # would glue two answers into one line.
    run = header("0" * 64, "toy", None)
    file = io.BytesIO(run + b'{"index": 0, "outputs": {}}\n{"index": 1, "outputs": {}}')
    assert resume(file, run) == {0}
    file.seek(0, io.SEEK_END)
    append(file, 1, {"outputs": {}})
    _, *lines = file.getvalue().splitlines()
    assert [orjson.loads(line)["index"] for line in lines] == [0, 1]
