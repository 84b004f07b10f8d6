"""Fixtures for the live tests: ENGRAM_URL, ENGRAM_API_KEY and ENGRAM_TENANT
name a running gateway and a key for a tenant of its own (tests/python_client.rs
starts one on port 0 and sets them). Without a key the live tests skip; the
Rust test fails on any skip."""

import os
import uuid

import pytest
import pytest_asyncio

from engram_client import AsyncEngram, Engram

LIVE = bool(os.environ.get("ENGRAM_API_KEY"))
live = pytest.mark.skipif(not LIVE, reason="no ENGRAM_API_KEY: no gateway to test against")


def word():
    """A token no other test wrote: keeps tests on one tenant apart."""
    return "zq" + uuid.uuid4().hex[:10]


@pytest.fixture
def engram():
    if not LIVE:
        pytest.skip("no ENGRAM_API_KEY: no gateway to test against")
    with Engram() as client:
        yield client


@pytest_asyncio.fixture
async def aengram():
    if not LIVE:
        pytest.skip("no ENGRAM_API_KEY: no gateway to test against")
    async with AsyncEngram() as client:
        yield client


@pytest.fixture
def tenant():
    return os.environ.get("ENGRAM_TENANT", "")
