"""Every async test runs on asyncio and on trio, both in virtual time.

trio uses ``MockClock(autojump_threshold=0)``; asyncio uses the equivalent
``VirtualTimeEventLoop`` from ``tests/virtual_time.py``. A 30-second scenario takes
milliseconds and every elapsed time is exact, so timing tests assert equalities.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from trio.testing import MockClock

from tests.virtual_time import VirtualTimeEventLoop

#: anyio and hypothesis are pytest plugins, so pytest rewrites (parses) every module of
#: theirs when it is first imported — and both import some lazily: anyio its
#: subprocesses, hypothesis ``st.randoms()``'s module. Imported mid-run, deep in a
#: hypothesis test's stack, CPython 3.11.7's parser can trip over its own recursion
#: bookkeeping ("AST constructor recursion depth mismatch", cpython#106905): so they
#: are imported here, at collection.
LAZY_PLUGIN_MODULES = (
    "anyio._core._subprocesses",
    "hypothesis.strategies._internal.random",
    "hypothesis.internal.conjecture.optimiser",
)
for _module in LAZY_PLUGIN_MODULES:
    importlib.import_module(_module)

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


@pytest.fixture(autouse=True)
def _own_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test's gateways keep their default SQLite ledger in a folder of their own
    (``$XDG_STATE_HOME/guardstack``): no count outlives its test or reaches another."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
