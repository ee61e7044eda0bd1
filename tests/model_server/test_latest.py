"""The mailbox a streamed sequence's outputs wait in: the newest only, a last one kept."""

from __future__ import annotations

import asyncio

from carpool_model_server.latest import Latest


def last(value: str) -> bool:
    return value.startswith("end")


async def test_a_reader_behind_gets_the_newest_value_then_waits_for_the_next() -> None:
    box: Latest[str] = Latest(final=last)
    for value in ("a", "ab", "abc"):
        box.put(value)
    assert await box.get() == "abc"
    reading = asyncio.ensure_future(box.get())
    await asyncio.sleep(0)
    assert not reading.done()
    box.put("abcd")
    assert await asyncio.wait_for(reading, 1.0) == "abcd"


async def test_a_last_value_is_not_overtaken() -> None:
    """Whatever comes after a sequence's end (or its error) does not replace it."""
    box: Latest[str] = Latest(final=last)
    box.put("a")
    box.put("end: failed")
    box.put("ab")
    assert await box.get() == "end: failed"
