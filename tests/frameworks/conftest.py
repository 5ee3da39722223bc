"""Framework adapters run inside each framework's own agent loop, on asyncio in virtual time.

LangGraph, the OpenAI Agents SDK and pydantic-ai run their loops on asyncio (their
runners create asyncio tasks), so these tests run on asyncio only, with the
virtual-time loop from ``tests/virtual_time.py``: a tool that hangs for an hour
ends at its budget instantly, and elapsed times are exact.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.virtual_time import VirtualTimeEventLoop


@pytest.fixture(scope="session")
def anyio_backend() -> Any:
    return ("asyncio", {"loop_factory": VirtualTimeEventLoop})
