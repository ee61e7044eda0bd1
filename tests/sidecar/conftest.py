"""Fixtures of the sidecar's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session for the test's requests."""
    async with aiohttp.ClientSession() as session:
        yield session
