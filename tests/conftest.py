"""Every async test runs on asyncio and on trio, both in virtual time.

trio uses ``MockClock(autojump_threshold=0)``; asyncio uses the equivalent
``VirtualTimeEventLoop`` from ``tests/virtual_time.py``. A 30-second scenario takes
milliseconds and every elapsed time is exact, so timing tests assert equalities.
"""

from __future__ import annotations

import os
from typing import Any

import anyio._core._subprocesses  # noqa: F401 - see below
import pytest
from hypothesis import HealthCheck, settings
from trio.testing import MockClock

from tests.virtual_time import VirtualTimeEventLoop

# anyio imports its subprocess module lazily, and pytest rewrites it (anyio is a pytest
# plugin) when first used — mid-run, where CPython 3.11.7's parser can trip over its own
# recursion bookkeeping ("AST constructor recursion depth mismatch"). Import it up front.

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """A fresh virtual clock for every test: one shared by the session would carry the
    time every earlier test spent, and at a large virtual time a sum of waits is no
    longer exact in floating point (60 s becomes 60.000000000000114)."""
    if request.param == "asyncio":
        return ("asyncio", {"loop_factory": VirtualTimeEventLoop})
    return ("trio", {"clock": MockClock(autojump_threshold=0)})
