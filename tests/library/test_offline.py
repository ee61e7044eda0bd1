"""Offline batch inference: `carpool infer` over a file, and `batch_inference` in process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from library.tiny_lm import WORDS
from support.model_server import SUPPORT_DIR

import carpool_model_server
from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.handler import (
    Handler,
    HandlerSettings,
    Prepared,
    require_input,
    split_valid,
)
from carpool_model_server.offline import BatchInference

TESTS_DIR = Path(__file__).resolve().parents[1]
HANDLER = "library.padded_handler:PaddedBytesHandler"
SLOW = "model_handlers:SlowInferHandler"  # the toy model, CARPOOL_TEST_INFER_S per batch
COUNT = 10_000
MALFORMED, MISSING_INPUT = 5_000, 7_000
BLOB = TensorSpec("blob", BYTES, (1,), max_element_bytes=2 << 20)


def mixed_texts(count: int, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 120, size=count)
    return [" ".join(rng.choice(WORDS, size=int(n))) for n in lengths]


@pytest.fixture(scope="module")
def input_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("offline") / "data.jsonl"
    lines = [orjson.dumps({"id": f"doc-{i}", "text": t}) for i, t in enumerate(mixed_texts(COUNT))]
    lines[MALFORMED] = b'{"text": "unterminated'
    lines[MISSING_INPUT] = b'{"id": "no text here"}'
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def run_infer(
    input_path: Path, output_path: Path, *extra: str, handler: str = HANDLER
) -> subprocess.CompletedProcess[str]:
    """Run `carpool infer` as a user would."""
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    args = ["--handler", handler, "--input", str(input_path), "--output", str(output_path)]
    return subprocess.run(
        [sys.executable, "-m", "carpool", "infer", *args, "--torch-threads", "1", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
        check=False,
    )


def infer(input_path: Path, output_path: Path) -> str:
    """Run `carpool infer` as a user would, to success; its stderr."""
    done = run_infer(input_path, output_path, "--batch-size", "64")
    assert done.returncode == 0, done.stderr
    return done.stderr


def answers_in(output_path: Path) -> list[dict[str, Any]]:
    """The answer lines of an output, after its header line."""
    header, *lines = output_path.read_bytes().splitlines()
    assert "carpool_infer" in orjson.loads(header)
    return [orjson.loads(line) for line in lines]


def check_in_input_order(input_path: Path, output_path: Path) -> list[dict[str, object]]:
    answers = answers_in(output_path)
    assert [answer["index"] for answer in answers] == list(range(COUNT))
    for index, line in enumerate(input_path.read_bytes().splitlines()):
        if index == MALFORMED:
            assert answers[index]["status"] == 400 and "not JSON" in answers[index]["error"]
        elif index == MISSING_INPUT:
            assert answers[index]["status"] == 400 and "text" in answers[index]["error"]
        else:
            text = orjson.loads(line)["text"]
            assert answers[index]["outputs"]["length"] == [len(text.encode())]
    return answers


@pytest.mark.slow
def test_infer_writes_every_line_in_input_order_and_resumes(
    input_file: Path, tmp_path: Path
) -> None:
    complete = tmp_path / "complete.jsonl"
    report = infer(input_file, complete)
    assert f"{COUNT - 1} items in" in report  # the malformed line never reaches the handler
    assert "padding ratio" in report
    reference = check_in_input_order(input_file, complete)

    # A run stopped part way: some answers written out of order, the last one torn.
    rng = np.random.default_rng(0)
    kept = sorted(rng.choice(COUNT, size=3_000, replace=False), key=lambda _: rng.random())
    header, *lines = complete.read_bytes().splitlines(keepends=True)
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_bytes(header + b"".join(lines[i] for i in kept) + lines[1][:25])
    report = infer(input_file, resumed)
    assert "resuming: 3000 lines already answered" in report
    assert f"{COUNT - 3_000 - (MALFORMED not in kept)} items in" in report
    answers = check_in_input_order(input_file, resumed)
    for ours, theirs in zip(answers, reference, strict=True):
        if "outputs" in theirs:
            embedding = ours["outputs"]["embedding"]  # type: ignore[index]
            np.testing.assert_allclose(embedding, theirs["outputs"]["embedding"], atol=1e-5)


def test_sorting_by_length_cuts_padding_and_keeps_order() -> None:
    records = [{"text": text} for text in mixed_texts(COUNT)]
    runs = {}
    for sort in (True, False):
        with BatchInference(HANDLER, batch_size=64, torch_threads=1) as inference:
            ordered = [None] * COUNT
            for indices, results in inference.run(records, sort_by_length=sort):
                for index, result in zip(indices, results, strict=True):
                    ordered[index] = result
            runs[sort] = (inference.stats, ordered)
    (sorted_stats, sorted_results), (plain_stats, plain_results) = runs[True], runs[False]
    assert sorted_stats.items == plain_stats.items == COUNT
    # Lengths spread over 1..120 words: unsorted batches pad to about twice their data.
    assert plain_stats.padding_ratio > 0.5
    assert sorted_stats.padding_ratio < plain_stats.padding_ratio / 20
    for ours, theirs in zip(sorted_results, plain_results, strict=True):
        assert ours is not None and theirs is not None
        assert ours.outputs is not None and theirs.outputs is not None
        np.testing.assert_allclose(
            ours.outputs["embedding"].to_numpy(), theirs.outputs["embedding"].to_numpy(), atol=1e-5
        )


@pytest.mark.slow
def test_batch_inference_with_minilm_matches_one_at_a_time() -> None:
    texts = mixed_texts(48, seed=11)
    batched = carpool_model_server.batch_inference("text-embedding", texts, batch_size=16)
    alone = carpool_model_server.batch_inference("text-embedding", texts[:6], batch_size=1)
    for ours, theirs in zip(batched, alone, strict=False):
        assert ours.outputs is not None and theirs.outputs is not None
        np.testing.assert_allclose(
            ours.outputs["embedding"].to_numpy(), theirs.outputs["embedding"].to_numpy(), atol=1e-5
        )


def three_lines(path: Path, first: str = "one") -> Path:
    path.write_text("".join(orjson.dumps({"text": t}).decode() + "\n" for t in (first, "b", "c")))
    return path


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 1 with one line saying why, and no traceback."""
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("Error: ") and all(word in line for word in words), line


def test_infer_refuses_its_input_as_its_output(tmp_path: Path) -> None:
    data = three_lines(tmp_path / "data.jsonl")
    before = data.read_bytes()
    refused(run_infer(data, data), "--output", "is the input")
    (tmp_path / "link.jsonl").symlink_to(data)
    refused(run_infer(data, tmp_path / "link.jsonl"), "--output", "is the input")
    assert data.read_bytes() == before


def test_infer_refuses_a_file_it_did_not_write(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    refused(run_infer(three_lines(tmp_path / "data.jsonl"), notes), "not an output of carpool")
    assert notes.read_text() == "my notes\n"
    refused(run_infer(tmp_path / "data.jsonl", Path(os.devnull)), "not a regular file")


def test_infer_resumes_only_its_own_input_and_handler(tmp_path: Path) -> None:
    first, output = three_lines(tmp_path / "first.jsonl"), tmp_path / "out.jsonl"
    infer(first, output)
    written = output.read_bytes()
    assert [a["outputs"]["length"] for a in answers_in(output)] == [[3], [1], [1]]

    # Run again: nothing left to do, nothing changed.
    assert "resuming: 3 lines already answered" in infer(first, output)
    assert output.read_bytes() == written
    # Another input, or the same input under another handler: refused, the output kept.
    other = three_lines(tmp_path / "other.jsonl", first="four")
    refused(run_infer(other, output), "another input")
    refused(run_infer(first, output, handler="toy"), "another handler")
    assert output.read_bytes() == written


def test_values_out_of_range_are_400_lines_and_the_rest_runs(
    tmp_path: Path, tiny_lm_path: Path
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    records = [
        {"text_input": "the cat", "max_new_tokens": 3},
        {"text_input": "the cat", "max_new_tokens": 3_000_000_000},  # past INT32
        {"text_input": "the cat", "max_new_tokens": 300},  # past the model's context of 256
        {"text_input": "the cat", "temperature": 1e39},  # past FP32
        {"text_input": "the cat", "max_new_tokens": "3"},
        {"text_input": "the cat", "max_new_tokens": 3},
    ]
    prompts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    output = tmp_path / "out.jsonl"
    done = run_infer(prompts, output, "--model-path", str(tiny_lm_path), handler="text-generation")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    answers = answers_in(output)
    assert [answer.get("status", 200) for answer in answers] == [200, 400, 400, 400, 400, 200]
    assert answers[0]["outputs"] == answers[5]["outputs"]
    assert "3000000000 is out of range for INT32" in answers[1]["error"]
    assert "outside the model's range [1, 255]" in answers[2]["error"]
    assert "out of range for FP32" in answers[3]["error"]
    assert "takes INT32 numbers" in answers[4]["error"]


def test_infer_reads_its_input_once_so_a_pipe_works(tmp_path: Path) -> None:
    data = three_lines(tmp_path / "data.jsonl")
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    output = tmp_path / "out.jsonl"
    args = ["--handler", HANDLER, "--input", "/dev/stdin", "--output", str(output)]
    done = subprocess.run(
        [sys.executable, "-m", "carpool", "infer", *args, "--torch-threads", "1"],
        input=data.read_bytes(),
        capture_output=True,
        env=env,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [answer["outputs"]["length"] for answer in answers_in(output)] == [[3], [1], [1]]


def test_a_second_run_on_an_output_being_written_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"".join(b'{"input": [1, 2, 3, 4]}\n' for _ in range(200)))
    output = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.2"}
    args = ["--input", str(data), "--output", str(output), "--batch-size", "4"]
    command = [sys.executable, "-m", "carpool", "infer", "--handler", SLOW, *args]
    first = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while output.read_bytes().count(b"\n") < 2 if output.exists() else True:
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.02)
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        refused(second, "being written by another carpool infer")
        assert first.wait(120) == 0
    finally:
        first.kill()
        first.wait()
    assert len(answers_in(output)) == 200


def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    data = three_lines(tmp_path / "data.jsonl")
    refused(run_infer(data, tmp_path / "no-such-folder" / "out.jsonl"), "cannot write --output")


class FileSizes(Handler[list[int], list[int]]):
    """Answers each item's `blob` size: all its work is the bytes it is given."""

    metadata = Metadata("carpool_test", (BLOB,), (TensorSpec("size", "INT64", (1,)),))

    def load(self, device: torch.device) -> None:
        pass

    def preprocess(self, items: Sequence[Item]) -> Prepared[list[int]]:
        sizes, rejected = split_valid(items, _size_of)
        return Prepared(sizes, len(sizes), rejected)

    def infer(self, batch: list[int]) -> list[int]:
        return batch

    def postprocess(self, outputs: list[int]) -> list[dict[str, Tensor]]:
        return [{"size": Tensor.from_numpy(np.array([size]))} for size in outputs]


def _size_of(item: Item) -> int:
    (data,) = require_input(item, BLOB).data
    assert isinstance(data, bytes)
    return len(data)


def test_files_are_read_batch_by_batch(tmp_path: Path) -> None:
    mib = 1 << 20
    (tmp_path / "blob.bin").write_bytes(b"x" * mib)
    records: list[Any] = [{"blob": {"file": "blob.bin"}}] * 48 + [{"blob": {"file": "gone"}}]
    settings = HandlerSettings(None, torch.float32, 4)
    with BatchInference(FileSizes(settings), batch_size=4) as inference:
        tracemalloc.start()
        try:
            answered = [
                (index, result)
                for indices, results in inference.run(records, base=tmp_path)
                for index, result in zip(indices, results, strict=True)
            ]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # A batch of 4 files at a time, not all 48 before the first batch runs.
    assert peak < 12 * mib, f"{peak / mib:.0f} MiB"
    sizes = {i: result.outputs["size"].to_numpy()[0] for i, result in answered if result.outputs}
    assert sizes == {index: mib for index in range(48)}
    assert [result.status for index, result in answered if index == 48] == [400]
