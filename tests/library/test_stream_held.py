"""A stream whose reader falls behind the token loop (its frames wait on a slow sidecar):
the outputs it has not read yet hold one output's tokens, not one output per step, each
with every token so far; and its answer is the one it gets when read as it comes."""

from __future__ import annotations

import asyncio
import gc

from library.test_text_generation import prompt_item
from transformers.generation.continuous_batching.requests import GenerationOutput

from carpool_model_server.continuous import Piece
from carpool_model_server.handler_text_generation import TextGenerationHandler

# A prompt the tiny GPT-2 answers past TOKENS tokens without its end of sequence.
PROMPT = "river star prompt"
TOKENS = 32


def unread_outputs() -> tuple[int, bool]:
    """The tokens of the loop's outputs this process holds (each holds its sequence's tokens
    so far), and whether one is a sequence's last."""
    outputs = [each for each in gc.get_objects() if type(each) is GenerationOutput]
    return sum(len(each.generated_tokens) for each in outputs), any(
        each.is_finished() for each in outputs
    )


async def read_late(
    handler: TextGenerationHandler, stop: list[str] | None
) -> tuple[list[Piece], int]:
    """The stream's pieces, read after its first one only once the loop has finished the
    sequence; and the tokens its unread outputs held then."""
    pieces = handler.stream(prompt_item(PROMPT, max_new_tokens=TOKENS, stop=stop))
    assert pieces is not None
    first = await anext(pieces)
    for _ in range(500):  # the loop's steps go on while nothing reads
        held_tokens, finished = unread_outputs()
        if finished:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the sequence did not finish")
    return [first, *[piece async for piece in pieces]], held_tokens


async def read_as_it_comes(handler: TextGenerationHandler, stop: list[str] | None) -> list[Piece]:
    pieces = handler.stream(prompt_item(PROMPT, max_new_tokens=TOKENS, stop=stop))
    assert pieces is not None
    return [piece async for piece in pieces]


async def test_a_reader_behind_the_loop_holds_one_output_and_gets_the_same_answer(
    token_loop: TextGenerationHandler,
) -> None:
    """(Before, every step's output waited in a queue: 32 outputs of 1 to 32 tokens.)"""
    promptly = await read_as_it_comes(token_loop, None)
    late, held_tokens = await read_late(token_loop, None)
    answer = late[-1].answer
    assert answer is not None and answer.generated_tokens == TOKENS
    assert held_tokens <= 2 * TOKENS  # the newest output, and the one read last
    assert answer == promptly[-1].answer
    assert "".join(piece.text for piece in late) == answer.text


async def test_a_stop_string_cuts_where_it_does_for_a_reader_that_keeps_up(
    token_loop: TextGenerationHandler,
) -> None:
    """Tokens that come together, past a stop string and on to the token limit: the answer
    ends before the stop string and counts the tokens up to it, as the loop's step by step
    (and the static way's) do."""
    free = (await read_as_it_comes(token_loop, None))[-1].answer
    assert free is not None
    stop = [free.text.split()[12]]
    promptly = (await read_as_it_comes(token_loop, stop))[-1].answer
    late, _ = await read_late(token_loop, stop)
    answer = late[-1].answer
    assert answer is not None and answer.finish_reason == "stop_sequence"
    assert answer == promptly
    assert answer.generated_tokens < TOKENS
    assert "".join(piece.text for piece in late) == answer.text
