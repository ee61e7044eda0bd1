"""`carpool infer` killed part way, again and again, and outputs that are not its own.

One implementation for the quick test (`test_infer_resume.py`) and the soak
(`bench/soak.py infer_resume`). `carpool infer` runs the toy model (2 * x + 1, so every
answer is checked exactly) at a fixed time per batch (`model_handlers:SlowInferHandler`);
each run is killed with SIGKILL once a random number of answers is written, and the same
command runs again, until one run finishes. Then the same command is pointed at files that
are not its output: its input, another input's output, a file of notes.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from reliability.traffic import expected, rows_for
from support.model_server import SUPPORT_DIR

HANDLER = "model_handlers:SlowInferHandler"
POLL_S = 0.01


@dataclass(frozen=True)
class Plan:
    lines: int = 2000
    kills: int = 3
    batch_s: float = 0.002  # the model's time per batch of 4
    seed: int = 5
    run_timeout_s: float = 120.0


@dataclass
class Report:
    killed_at: list[int] = field(default_factory=list)  # answers written at each SIGKILL
    resumed: list[int] = field(default_factory=list)  # "resuming: N lines" of each rerun
    mismatches: list[str] = field(default_factory=list)  # the final output against a clean run
    refusals: dict[str, tuple[int | None, str, bool]] = field(default_factory=dict)
    # refusal case -> (exit code, its last stderr line, whether the file was left as it was)


def run(folder: Path, plan: Plan) -> Report:
    report = Report()
    rng = random.Random(plan.seed)
    data = _input(folder / "data.jsonl", plan, rng)
    output = folder / "out.jsonl"
    for kill in range(plan.kills):
        left = plan.lines - max(0, _lines(output) - 1)  # answers still to write
        # Spread over the kills to come, so that each lands part way.
        answers = rng.randint(1, max(1, 2 * left // (plan.kills - kill + 1)))
        log = folder / f"killed-{kill}.log"
        report.killed_at.append(_kill_part_way(data, output, answers, log, plan))
        report.resumed.append(_resumed(log.read_text()))
    report.resumed.append(_resumed(_finish(data, output, plan)))
    report.mismatches = _check(output, data)

    other = _input(folder / "other.jsonl", plan, random.Random(plan.seed + 1))
    notes = folder / "notes.txt"
    notes.write_text("a file of notes, not answers\n")
    for case, (given, kept) in {
        "input as output": (data, data),
        "another input's output": (other, output),
        "a file of notes": (data, notes),
    }.items():
        before = _digest(kept)
        done = _infer(given, kept, plan)
        last = done.stderr.strip().splitlines()[-1:] or [""]
        report.refusals[case] = (done.returncode, last[0], _digest(kept) == before)
    return report


def _input(path: Path, plan: Plan, rng: random.Random) -> Path:
    lines = [orjson.dumps({"id": n, "input": rows_for(rng, 1)[0]}) for n in range(plan.lines)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _command(data: Path, output: Path) -> list[str]:
    args = ["--handler", HANDLER, "--input", str(data), "--output", str(output)]
    return [sys.executable, "-m", "carpool", "infer", *args, "--batch-size", "4"]


def _env(plan: Plan) -> dict[str, str]:
    extra = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(plan.batch_s)}
    return {**os.environ, **extra}


def _infer(data: Path, output: Path, plan: Plan) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_command(data, output), "--torch-threads", "1"],
        capture_output=True,
        text=True,
        env=_env(plan),
        timeout=plan.run_timeout_s,
        check=False,
    )


def _finish(data: Path, output: Path, plan: Plan) -> str:
    done = _infer(data, output, plan)
    assert done.returncode == 0, done.stderr
    return done.stderr


def _kill_part_way(data: Path, output: Path, answers: int, log: Path, plan: Plan) -> int:
    """SIGKILL a run once `answers` more answer lines than at its start are in `output`;
    the lines in it then. The run's stderr goes to `log`."""
    start = max(1, _lines(output))  # the header comes first
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [*_command(data, output), "--torch-threads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=_env(plan),
        )
    deadline = time.monotonic() + plan.run_timeout_s
    try:
        while process.poll() is None and _lines(output) < start + answers:
            assert time.monotonic() < deadline, "carpool infer wrote nothing in time"
            time.sleep(POLL_S)
    finally:
        process.kill()
        process.wait()
    return _lines(output)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _resumed(stderr: str) -> int:
    for line in stderr.splitlines():
        if line.startswith("resuming: "):
            return int(line.split()[1])
    return 0


def _check(output: Path, data: Path) -> list[str]:
    """What in `output` is not each line's exact answer, once each, in input order."""
    header, *lines = output.read_bytes().splitlines()
    if "carpool_infer" not in orjson.loads(header):
        return [f"no header first: {header[:100]!r}"]
    records = [orjson.loads(line) for line in data.read_bytes().splitlines()]
    answers = [orjson.loads(line) for line in lines]
    if [answer["index"] for answer in answers] != list(range(len(records))):
        return [f"indices are not 0..{len(records) - 1} in order, once each"]
    return [
        f"line {answer['index']}: {answer}"
        for answer, record in zip(answers, records, strict=True)
        if answer.get("outputs", {}).get("output") != expected([record["input"]])
    ]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def summary(report: Report) -> str:
    refusals = "; ".join(
        f"{case}: exit {code}, {'left as it was' if kept else 'CHANGED'}: {line!r}"
        for case, (code, line, kept) in report.refusals.items()
    )
    return (
        f"killed with {report.killed_at} lines written; reruns resumed {report.resumed} lines; "
        f"{len(report.mismatches)} answers wrong; {refusals}"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = list(report.mismatches[:10])
    # Each run keeps every whole answer line of the runs before it (all but the header).
    if report.resumed != [0] + [written - 1 for written in report.killed_at]:
        broken.append(f"runs resumed {report.resumed} after {report.killed_at} lines written")
    for case, (code, line, kept) in report.refusals.items():
        if code != 1 or not line.startswith("Error: --output") or not kept:
            broken.append(f"{case}: exit {code}, {line!r}, file left as it was: {kept}")
    return broken
