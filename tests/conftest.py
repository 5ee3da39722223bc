"""Every async test runs on asyncio and on trio, both in virtual time.

trio uses ``MockClock(autojump_threshold=0)``; asyncio uses the equivalent
``VirtualTimeEventLoop`` from ``tests/virtual_time.py``. A 30-second scenario takes
milliseconds and every elapsed time is exact, so timing tests assert equalities.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from trio.testing import MockClock

from tests.virtual_time import VirtualTimeEventLoop

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"loop_factory": VirtualTimeEventLoop}), id="asyncio"),
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio"),
    ],
    scope="session",
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param
