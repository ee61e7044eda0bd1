"""The text-generation handler: batched, left-padded generation with per-item settings."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from library.tiny_lm import WORDS
from support.model_server import ModelServer, post_batch, run_model_server

from carpool.contract.wire import BYTES, ItemResult, Tensor
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_generation import (
    MAX_STOP_BYTES,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    PROMPT_BYTES_PER_TOKEN,
    Request,
    TextGenerationHandler,
    _RowStop,
)
from carpool_model_server.offline import BatchInference
from carpool_model_server.streamed_text import CONTEXT_TOKENS

Item = dict[str, Tensor]


def prompt_item(
    prompt: str,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    stop: list[str] | None = None,
    seed: int | None = None,
) -> Item:
    item = {"text_input": Tensor(BYTES, (1,), [prompt.encode()])}
    if max_new_tokens is not None:
        item["max_new_tokens"] = Tensor.from_numpy(np.array([max_new_tokens], dtype=np.int32))
    if temperature is not None:
        item["temperature"] = Tensor.from_numpy(np.array([temperature], dtype=np.float32))
    if stop is not None:
        item["stop"] = Tensor(BYTES, (len(stop),), [s.encode() for s in stop])
    if seed is not None:
        item["seed"] = Tensor.from_numpy(np.array([seed], dtype=np.int32))
    return item


def text_of(result: ItemResult) -> str:
    assert result.error is None, result.error
    assert result.outputs is not None
    data = result.outputs["text_output"].data
    assert isinstance(data, list)
    return data[0].decode()


@pytest.fixture(scope="module")
def handler(tiny_lm_path: Path) -> TextGenerationHandler:
    loaded = TextGenerationHandler(HandlerSettings(tiny_lm_path, torch.float32, 64))
    loaded.load(torch.device("cpu"))
    return loaded


def generate(handler: TextGenerationHandler, items: list[Item]) -> list[str | Exception]:
    """Outputs in item order; a refused item gives an InvalidItem-like message instead."""
    with torch.inference_mode():
        prepared = handler.preprocess(items)
        outputs = iter(handler.postprocess(handler.infer(prepared.batch)) if prepared.batch else [])
    answers: list[str | Exception] = []
    for index in range(len(items)):
        if index in prepared.rejected:
            answers.append(ValueError(prepared.rejected[index]))
        else:
            data = next(outputs)["text_output"].data
            assert isinstance(data, list)
            answers.append(data[0].decode())
    return answers


def mixed_prompts() -> list[Item]:
    rng = np.random.default_rng(7)
    items = []
    for index in range(12):
        words = rng.choice(WORDS, size=int(rng.integers(1, 24)))
        items.append(prompt_item(" ".join(words), max_new_tokens=int(rng.integers(1, 30))))
        if index % 4 == 3:
            items[-1] = prompt_item(" ".join(words), max_new_tokens=20, stop=["sun", "moon"])
    return items


def test_greedy_batch_gives_each_prompt_what_it_gets_alone(
    handler: TextGenerationHandler,
) -> None:
    items = mixed_prompts()
    # A sampled neighbour puts the batch on the sampling path; greedy rows must not notice.
    batch = [*items, prompt_item("the cat", max_new_tokens=25, temperature=1.5)]
    batched = generate(handler, batch)[: len(items)]
    alone = [generate(handler, [item])[0] for item in items]
    assert batched == alone
    assert all(isinstance(text, str) and text for text in batched)


def test_prompts_are_bucketed_by_length_and_padding_is_measured(
    handler: TextGenerationHandler,
) -> None:
    prepared = handler.preprocess(mixed_prompts())
    assert prepared.batch is not None
    real, slots = prepared.batch.padding()
    # Lengths 1..23 fall in buckets of 1, 2, 4, 8, 16, 32: padding stays below half.
    assert len(prepared.batch.buckets) > 1
    assert real < slots < 2 * real
    for bucket in prepared.batch.buckets:
        lengths = [len(request.prompt_ids) for request in bucket.requests]
        assert max(lengths) <= 2 * min(lengths)


def test_each_row_stops_at_its_own_limit_and_stop_string(handler: TextGenerationHandler) -> None:
    prompt = "the dog ran far away"
    free = generate(handler, [prompt_item(prompt, max_new_tokens=30)])[0]
    assert isinstance(free, str)
    stop_word = free.split()[4]
    cut, short, full = generate(
        handler,
        [
            prompt_item(prompt, max_new_tokens=30, stop=[stop_word]),
            prompt_item(prompt, max_new_tokens=3),
            prompt_item(prompt, max_new_tokens=30),
        ],
    )
    assert cut == free[: free.index(stop_word)]
    assert short == "".join(f" {word}" for word in free.split()[:3])  # read after the prompt
    assert full == free


def test_a_stop_string_is_looked_for_in_the_answer_as_shown(
    handler: TextGenerationHandler,
) -> None:
    """Special tokens are not in an answer's text: one the model generates ("<unk>" first,
    for this prompt) does not end it at a stop string its spelling holds."""
    prompt = "big tree evening queue cat token"
    free, held = (
        generate(handler, [prompt_item(prompt, max_new_tokens=10, stop=stop)])[0]
        for stop in ([], ["<", "unk"])
    )
    assert held == free and isinstance(free, str) and len(free.split()) == 8


@pytest.mark.parametrize("batching", ["static", "continuous"])
async def test_an_answer_ends_at_any_end_of_sequence_token_the_model_names(
    handler: TextGenerationHandler, tiny_lm_path: Path, tmp_path: Path, batching: str
) -> None:
    """A model's generation config may name several end-of-sequence tokens (Llama 3's
    end of turn beside its end of text, Qwen's): its own `generate` stops at any of them."""
    from transformers import GenerationConfig

    prompt = "the dog ran far away"
    words = str(generate(handler, [prompt_item(prompt, max_new_tokens=30)])[0]).split()
    end = handler.tokenizer.convert_tokens_to_ids(words[3])
    folder = shutil.copytree(tiny_lm_path, tmp_path / "lm")
    GenerationConfig(eos_token_id=[0, end]).save_pretrained(folder)
    options = {"batching": batching}
    loaded = TextGenerationHandler(HandlerSettings(folder, torch.float32, 4, options))
    loaded.load(torch.device("cpu"))
    try:
        item = prompt_item(prompt, max_new_tokens=30)
        if loaded.loop is None:
            with torch.inference_mode():
                prepared = loaded.preprocess([item])
                assert prepared.batch is not None
                (answer,) = loaded.infer(prepared.batch)
        else:
            pieces = loaded.stream(item)
            assert pieces is not None
            answer = [piece async for piece in pieces][-1].answer
    finally:
        loaded.close()
    assert answer is not None
    assert answer.text == "".join(f" {word}" for word in words[: words.index(words[3])])
    assert answer.finish_reason == "eos_token"


def test_a_row_a_stop_string_ended_counts_its_tokens_not_the_padding_after(
    handler: TextGenerationHandler, tiny_lm_path: Path, tmp_path: Path
) -> None:
    """With a pad token of its own (not its end of sequence), a row that a stop string
    ended is padded while the rest of its batch goes on: the padding is not its tokens."""
    from transformers import AutoTokenizer

    folder = shutil.copytree(tiny_lm_path, tmp_path / "lm")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = "<unk>"
    tokenizer.save_pretrained(folder)
    padded = TextGenerationHandler(HandlerSettings(folder, torch.float32, 4))
    padded.load(torch.device("cpu"))
    prompt = "the dog ran far away"
    stop = [str(generate(handler, [prompt_item(prompt, max_new_tokens=30)])[0]).split()[4]]
    ended = prompt_item(prompt, max_new_tokens=30, stop=stop)
    longer = "carpool rain answer rug queue cat sun"  # in the same bucket, 30 tokens long
    counts = []
    for items in ([ended], [ended, prompt_item(longer, max_new_tokens=30)]):
        with torch.inference_mode():
            prepared = padded.preprocess(items)
            assert prepared.batch is not None
            answer = padded.infer(prepared.batch)[0]
        assert answer.finish_reason == "stop_sequence"
        counts.append(answer.generated_tokens)
    assert counts == [5, 5]


def test_each_answer_says_why_it_ended_and_counts_its_tokens(
    handler: TextGenerationHandler,
) -> None:
    prompt = "the dog ran far away"
    free = generate(handler, [prompt_item(prompt, max_new_tokens=30)])[0]
    assert isinstance(free, str)
    items = [
        prompt_item(prompt, max_new_tokens=30, stop=[free.split()[4]]),
        prompt_item(prompt, max_new_tokens=3),
    ]
    with torch.inference_mode():
        prepared = handler.preprocess(items)
        assert prepared.batch is not None
        answers = handler.infer(prepared.batch)
    assert [a.finish_reason for a in answers] == ["stop_sequence", "length"]
    assert [a.prompt_tokens for a in answers] == [5, 5]
    assert answers[1].generated_tokens == 3
    outputs = handler.postprocess(answers)[1]
    assert outputs["finish_reason"].data == [b"length"]
    assert outputs["generated_tokens"].to_numpy().tolist() == [3]


def test_a_seeded_sample_is_the_same_whatever_shares_its_batch(
    handler: TextGenerationHandler,
) -> None:
    def sampled(seed: int) -> Item:
        return prompt_item("the moon", max_new_tokens=30, temperature=2.0, seed=seed)

    alone = generate(handler, [sampled(7)])[0]
    neighbours = [prompt_item("a dog ran", max_new_tokens=12, temperature=1.0), sampled(8)]
    batched = generate(handler, [*neighbours, sampled(7)])
    assert batched[2] == alone
    assert batched[1] != alone  # another seed draws another text (at temperature 2)


def test_bad_items_are_refused_and_neighbours_still_run(handler: TextGenerationHandler) -> None:
    good = prompt_item("a red house", max_new_tokens=5)
    answers = generate(
        handler,
        [
            prompt_item("a red house", max_new_tokens=0),
            good,
            prompt_item("the " * 250, max_new_tokens=10),  # past the 256-token context
            prompt_item("sky", temperature=-1.0),
            {"prompt": Tensor(BYTES, (1,), [b"wrong name"])},
        ],
    )
    assert answers[1] == generate(handler, [good])[0]
    messages = [str(a) for a in answers if isinstance(a, Exception)]
    assert len(messages) == 4
    assert "max_new_tokens" in messages[0] and "context" in messages[1]
    assert "temperature" in messages[2] and "text_input" in messages[3]


def test_the_metadata_bounds_each_setting_to_what_the_model_can_run(
    handler: TextGenerationHandler,
) -> None:
    specs = {spec.name: spec for spec in handler.metadata.inputs}
    # The tiny model's context is 256 tokens: a prompt of 255 at most, and 1 new token.
    assert specs["text_input"].max_element_bytes == 255 * PROMPT_BYTES_PER_TOKEN
    assert (specs["max_new_tokens"].minimum, specs["max_new_tokens"].maximum) == (1, 255)
    assert (specs["temperature"].minimum, specs["temperature"].maximum) == (0, MAX_TEMPERATURE)
    assert specs["stop"].max_elements == MAX_STOP_STRINGS
    assert specs["stop"].max_element_bytes == MAX_STOP_BYTES


def test_a_temperature_however_small_samples_the_greedy_token(
    handler: TextGenerationHandler,
) -> None:
    prompt = "the dog ran far away"
    greedy = generate(handler, [prompt_item(prompt, max_new_tokens=12)])[0]
    tiny = [prompt_item(prompt, max_new_tokens=12, temperature=t) for t in (1e-38, 1e-45, 1e-20)]
    assert generate(handler, tiny) == [greedy] * 3


class Measuring:
    """A tokenizer that notes the length of each text it is given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.lengths: list[int] = []

    def __call__(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self.lengths.append(len(text))
        return self.tokenizer(text, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def test_settings_past_their_bounds_are_refused_before_tokenizing(
    handler: TextGenerationHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = prompt_item("the " * 4_000_000)  # 16 MB
    items = [
        huge,
        prompt_item("the sky", max_new_tokens=10_000),
        prompt_item("the sky", temperature=1e9),
        prompt_item("the sky", temperature=float("nan")),
        prompt_item("the sky", stop=["sun"] * (MAX_STOP_STRINGS + 1)),
        prompt_item("the sky", stop=["s" * (MAX_STOP_BYTES + 1)]),
    ]
    tokenizer = Measuring(handler.tokenizer)
    monkeypatch.setattr(handler, "tokenizer", tokenizer)
    answers = generate(handler, items)
    # A 16 MB prompt took seconds to tokenize; refused on its length, it takes none.
    assert max(tokenizer.lengths, default=0) < 1000
    messages = [str(answer) for answer in answers]
    assert all(isinstance(answer, ValueError) for answer in answers), messages
    assert "max_element_bytes" in messages[0]
    assert "outside the model's range [1, 255]" in messages[1]
    assert "outside the model's range [0, 100]" in messages[2] and "nan" in messages[3]
    assert "max_elements" in messages[4] and "max_element_bytes" in messages[5]


def test_looking_for_stop_strings_costs_the_same_at_every_step(
    handler: TextGenerationHandler,
) -> None:
    # A row's stop strings are looked for after each token: decoding all its tokens so far
    # each time made a long generation's cost grow with the square of its length.
    decoded: list[int] = []

    class Counting:
        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            decoded.append(len(ids))
            return str(handler.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    row = Request([1], 5000, 0.0, ("never said",))
    stopping = _RowStop([row], 1, Counting(), torch.device("cpu"))
    for generated in (10, 1000, 4000):
        done = stopping(torch.ones((1, 1 + generated), dtype=torch.long), None)
        assert not done[0]
    assert max(decoded) <= MAX_STOP_BYTES + 8 + CONTEXT_TOKENS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_lm_path: Path) -> Iterator[ModelServer]:
    with run_model_server(
        tmp_path_factory.mktemp("generation"),
        "text-generation",
        "--model-path",
        str(tiny_lm_path),
        "--device",
        "cpu",
        "--warmup-sizes",
        "1,4",
        timeout_s=120,
    ) as running:
        yield running


async def test_model_server_serves_batched_generation(
    server: ModelServer, handler: TextGenerationHandler
) -> None:
    items = mixed_prompts()
    results = await post_batch(server, items)
    assert [text_of(result) for result in results] == generate(handler, items)


def test_offline_generation_sorts_by_prompt_tokens_and_keeps_order(
    handler: TextGenerationHandler, tiny_lm_path: Path
) -> None:
    rng = np.random.default_rng(5)
    prompts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 40)))) for _ in range(48)]
    records = [{"text_input": prompt, "max_new_tokens": 6} for prompt in prompts]
    with BatchInference(
        "text-generation", batch_size=8, model_path=tiny_lm_path, torch_threads=1
    ) as inference:
        answers: dict[int, ItemResult] = {}
        for indices, results in inference.run(records):
            answers.update(zip(indices, results, strict=True))
        # Neighbours in prompt tokens share a batch: little padding, one bucket per batch.
        assert inference.stats.padding_ratio < 0.1
    alone = [generate(handler, [prompt_item(p, max_new_tokens=6)])[0] for p in prompts[:8]]
    assert [text_of(answers[index]) for index in range(8)] == alone


def test_offline_records_take_max_tokens_and_refuse_settings_they_cannot_read(
    tiny_lm_path: Path,
) -> None:
    """`carpool infer` reads a record's `max_tokens` as the generate extension names it, and
    refuses a setting it would otherwise drop, rather than answer with the default; a null
    setting is one not given."""
    records = [
        {"text_input": "a cat", "max_tokens": 3, "id": "kept for the caller"},
        {"text_input": "a cat", "max_new_tokens": 3},
        {"text_input": "a cat", "max_tokens": 3, "max_new_tokens": 3},
        {"text_input": "a cat", "parameters": {"max_tokens": 3}},
        # null leaves a setting to its default, as /generate reads it.
        {"text_input": "a cat", "max_tokens": 3, "temperature": None, "stop": None},
    ]
    with BatchInference("text-generation", model_path=tiny_lm_path, torch_threads=1) as inference:
        answers = dict(
            answer
            for indices, results in inference.run(records)
            for answer in zip(indices, results, strict=True)
        )
    for index in (0, 1, 4):
        assert answers[index].error is None, answers[index].error
        assert answers[index].outputs is not None
        assert answers[index].outputs["generated_tokens"].to_numpy().tolist() == [3]
    assert text_of(answers[0]) == text_of(answers[1]) == text_of(answers[4])
    assert answers[2].status == answers[3].status == 400
    assert "'max_tokens'" in str(answers[2].error)
    assert "'parameters'" in str(answers[3].error)
