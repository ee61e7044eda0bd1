"""An answer's text is what its tokens add to the prompt's text, as transformers'
text-generation pipeline answers without the prompt: with a Llama 2 style tokenizer, whose
pieces carry the space before their word ("▁on") and whose decoding drops the text's first
space, the answer to "the cat sat" reads " on the mat", not "on the mat", so that prompt and
answer join to the text the model wrote. The same on every path, through a real sidecar and
model server: streamed and whole from the token loop, and in static batches (`/infer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from library.test_generate_route import post, request
from library.test_generate_stream import MODEL, continuous_pair, stream
from library.tiny_lm import after_prompt, build_tiny_lm
from support.sidecar import Pair
from transformers import AutoModelForCausalLM, AutoTokenizer

INFER = f"/v2/models/{MODEL}/infer"
# Prompts whose answers begin with a word (its space), with part of one ("the" "m"), with
# the end of the sequence; prompts that end in characters spelt byte by byte.
PROMPTS = ["a red house by the river", "the", "the cat sat", "the moon over wörld", "日本"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-llama-sp"), sentencepiece=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, llama_path: Path) -> Iterator[Pair]:
    with continuous_pair(tmp_path_factory.mktemp("answer-text"), llama_path) as running:
        yield running


@pytest.fixture(scope="module")
def expected(llama_path: Path) -> list[str]:
    """Each prompt's answer: the model's own greedy tokens for it, read after the prompt."""
    tokenizer = AutoTokenizer.from_pretrained(llama_path)
    model = AutoModelForCausalLM.from_pretrained(llama_path).eval()
    answers = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            output = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
        new = output[0, ids.shape[1] :].tolist()
        new = new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
        answers.append(after_prompt(tokenizer, ids[0].tolist(), new))
    # What this is about: answers that begin with a word's space, and one that does not.
    assert any(answer.startswith(" ") for answer in answers)
    assert any(answer[:1].isalpha() for answer in answers)
    return answers


def infer_body(prompts: list[str], **settings: tuple[str, Any]) -> dict[str, Any]:
    """One /infer batch of the prompts (run the static way), each with the same settings."""
    count = len(prompts)
    inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [count, 1], "data": prompts}]
    for name, (datatype, value) in settings.items():
        shape = [count, len(value)] if isinstance(value, list) else [count, 1]
        data = value * count if isinstance(value, list) else [value] * count
        inputs.append({"name": name, "datatype": datatype, "shape": shape, "data": data})
    return {"inputs": inputs}


def outputs_of(answer: dict[str, Any]) -> dict[str, list[Any]]:
    return {output["name"]: output["data"] for output in answer["outputs"]}


async def test_every_path_answers_the_text_that_follows_the_prompt(
    pair: Pair, expected: list[str]
) -> None:
    sidecar = pair.sidecar
    bodies = [request(prompt, max_tokens=MAX_TOKENS) for prompt in PROMPTS]
    async with aiohttp.ClientSession() as http:
        streamed = await asyncio.gather(*(stream(http, sidecar, body) for body in bodies))
        whole = await asyncio.gather(*(post(http, sidecar, body) for body in bodies))
        batch = infer_body(PROMPTS, max_new_tokens=("INT32", MAX_TOKENS))
        status, inferred = await post(http, sidecar, batch, path=INFER)
    assert status == 200, inferred
    static = outputs_of(inferred)["text_output"]
    for text, (status, events), (whole_status, answer), batched in zip(
        expected, streamed, whole, static, strict=True
    ):
        assert status == whole_status == 200, (events, answer)
        assert "".join(event["text_output"] for event in events) == text
        assert answer["text_output"] == batched == text


async def test_a_stop_string_is_looked_for_in_the_answer_as_it_follows_the_prompt(
    pair: Pair, expected: list[str]
) -> None:
    """A stop string that holds the answer's first space ends it at its first token."""
    sidecar = pair.sidecar
    index = next(i for i, text in enumerate(expected) if text.startswith(" "))
    prompt, stop = PROMPTS[index], expected[index][:3]
    body = request(prompt, max_tokens=MAX_TOKENS, stop=[stop])
    async with aiohttp.ClientSession() as http:
        _, events = await stream(http, sidecar, body)
        _, answer = await post(http, sidecar, body)
        batch = infer_body([prompt], max_new_tokens=("INT32", MAX_TOKENS), stop=("BYTES", [stop]))
        status, inferred = await post(http, sidecar, batch, path=INFER)
    assert status == 200, inferred
    static = outputs_of(inferred)
    ends = [
        (events[-1]["text_output"], events[-1]["finish_reason"], events[-1]["generated_tokens"]),
        (answer["text_output"], answer["finish_reason"], answer["generated_tokens"]),
        (static["text_output"][0], static["finish_reason"][0], static["generated_tokens"][0]),
    ]
    assert ends == [("", "stop_sequence", 1)] * 3
