"""guardstack's exceptions: one root to catch them all, each also the built-in kind a
caller would catch without knowing guardstack, and a configuration error that names
what to fix."""

from __future__ import annotations

import pytest

from guardstack import pipeline
from guardstack.pipeline import ConfigError, GuardstackError
from guardstack.pipeline.errors import (
    AgentLimitExceeded,
    ApprovalMismatch,
    DuplicateToolError,
    ScriptExhaustedError,
    SessionCorruptError,
    StoreUnsupported,
    TurnBlocked,
    TurnInProgressError,
)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (ConfigError, ValueError),
        (DuplicateToolError, ValueError),
        (SessionCorruptError, ValueError),
        (ApprovalMismatch, ValueError),
        (ScriptExhaustedError, RuntimeError),
        (TurnInProgressError, RuntimeError),
        (AgentLimitExceeded, RuntimeError),
        (StoreUnsupported, RuntimeError),
        (TurnBlocked, Exception),
    ],
)
def test_each_error_is_guardstacks_and_the_builtin_kind(error: type, builtin: type) -> None:
    assert issubclass(error, GuardstackError)
    assert issubclass(error, builtin)


def test_a_config_error_names_plugin_key_value_and_the_reason_alone() -> None:
    error = ConfigError(
        "retry: `attempts` must be an integer >= 1, got 0",
        plugin="retry",
        key="attempts",
        value=0,
        reason="must be an integer >= 1",
    )
    assert (error.plugin, error.key, error.value) == ("retry", "attempts", 0)
    assert error.reason == "must be an integer >= 1"
    assert str(error) == "retry: `attempts` must be an integer >= 1, got 0"
    assert ConfigError("bad").reason == "bad"  # no reason given: the message


def test_the_public_errors_are_exported_from_the_pipeline() -> None:
    for name in ("ConfigError", "GuardstackError", "TurnInProgressError", "DuplicateToolError"):
        assert hasattr(pipeline, name), name
