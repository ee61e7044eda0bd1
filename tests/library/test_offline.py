"""Offline batch inference: `carpool infer` over a file, and `batch_inference` in process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from library.tiny_lm import WORDS

import carpool_model_server
from carpool_model_server.offline import BatchInference

TESTS_DIR = Path(__file__).resolve().parents[1]
HANDLER = "library.padded_handler:PaddedBytesHandler"
COUNT = 10_000
MALFORMED, MISSING_INPUT = 5_000, 7_000


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


def infer(input_path: Path, output_path: Path) -> str:
    """Run `carpool infer` as a user would; its stderr."""
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    args = ["--handler", HANDLER, "--input", str(input_path), "--output", str(output_path)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "carpool",
            "infer",
            *args,
            "--batch-size",
            "64",
            "--torch-threads",
            "1",
        ],
        capture_output=True,
        env=env,
        timeout=150,
        check=True,
    )
    return done.stderr.decode()


def check_in_input_order(input_path: Path, output_path: Path) -> list[dict[str, object]]:
    answers = [orjson.loads(line) for line in output_path.read_bytes().splitlines()]
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
    lines = complete.read_bytes().splitlines(keepends=True)
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_bytes(b"".join(lines[i] for i in kept) + lines[1][:25])
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
