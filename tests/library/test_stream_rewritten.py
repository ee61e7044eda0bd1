"""A stream whose reader falls behind the token loop takes the tokens it missed at once: it
stops where a reader that kept up stops, even where a later token rewrites the text that
held a stop string (a byte that makes the "é" before it no UTF-8)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from library.tiny_lm import SPACE, sentencepiece_tokenizer

from carpool_model_server.continuous import Piece, TokenLoop
from carpool_model_server.handler_text_generation import Request


@dataclass
class Output:
    """One of the loop's outputs: the sequence's tokens so far."""

    generated_tokens: list[int]
    finished: bool
    error: None = None

    def is_finished(self) -> bool:
        return self.finished


class Router:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.result_handlers: dict[str, Any] = {}
        self.output_queue: queue.Queue[Any] = queue.Queue()


class Steps:
    """A stand-in for transformers' loop: one output per step, at the token counts given
    (several tokens a step: the reader fell behind), a turn of the event loop apart."""

    def __init__(self, tokens: list[int], counts: list[int]) -> None:
        self.tokens, self.counts = tokens, counts
        self.output_router = Router()
        self.handler: Any = None
        self.task: asyncio.Task[None] | None = None

    def register_result_handler(self, request_id: str, handler: Any) -> None:
        self.handler = handler

    def add_request(self, *_: Any, **__: Any) -> str:
        self.task = asyncio.get_running_loop().create_task(self._steps())
        return "added"

    def cancel_request(self, request_id: str) -> None:
        assert self.task is not None
        self.task.cancel()

    async def _steps(self) -> None:
        for count in self.counts:
            self.handler(Output(self.tokens[:count], count == len(self.tokens)))
            for _ in range(3):  # the reader's turn to take it
                await asyncio.sleep(0)


async def streamed(tokenizer: Any, tokens: list[int], counts: list[int]) -> list[Piece]:
    loop = object.__new__(TokenLoop)  # its loop stood in for: no model
    loop.tokenizer, loop.eos_ids = tokenizer, [tokenizer.eos_token_id]
    loop._manager, loop._device, loop._ids = Steps(tokens, counts), None, itertools.count()
    request = Request(tokenizer("the cat")["input_ids"], len(tokens), 0.0, ("é",))
    async with asyncio.timeout(5):
        return [piece async for piece in loop.generate(request)]


@pytest.mark.parametrize("late", [[1, 9], [1, 5, 9], [2, 7, 9]])
async def test_a_stop_string_a_later_byte_rewrites_still_stops_a_reader_behind(
    late: list[int],
) -> None:
    tokenizer = sentencepiece_tokenizer()
    pieces = [f"{SPACE}the", "<0xC3>", "<0xA9>", "<0x97>", f"{SPACE}sky", f"{SPACE}the"]
    tokens = tokenizer.convert_tokens_to_ids([*pieces, f"{SPACE}sun", "<0xC3>", "<0xA9>"])
    assert tokenizer.decode(tokens[:3]).endswith("é") and "é" not in tokenizer.decode(tokens[:4])
    promptly = await streamed(tokenizer, tokens, list(range(1, len(tokens) + 1)))
    answer = promptly[-1].answer
    assert answer is not None and (answer.text, answer.finish_reason) == (" the", "stop_sequence")
    assert answer.generated_tokens == 3
    behind = await streamed(tokenizer, tokens, late)
    assert behind[-1].answer == answer
    assert "".join(piece.text for piece in behind) == answer.text
