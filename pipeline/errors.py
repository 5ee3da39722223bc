"""The one exception tree for programmer and configuration mistakes.

Model-facing failures are never exceptions: they are ``ToolResult`` values with an
error code, so the model reads them and the session log records them. What raises
is a mistake in code or configuration, and every such error derives from
``GuardstackError`` and from the nearest builtin, so ``except ValueError`` keeps
working for callers that do not know guardstack.
"""

from __future__ import annotations

__all__ = [
    "AgentLimitExceeded",
    "ApprovalMismatch",
    "ConfigError",
    "DuplicateToolError",
    "GuardstackError",
    "GuardstackWarning",
    "ScriptExhaustedError",
    "SessionCorruptError",
    "SessionTailWarning",
    "StoreUnsupported",
    "TurnBlocked",
    "TurnInProgressError",
]


class GuardstackError(Exception):
    """Root of every exception guardstack raises on purpose."""


class ConfigError(GuardstackError, ValueError):
    """Bad configuration, raised at construction or load time.

    ``plugin``, ``key`` and ``value`` name what was wrong when known; the message
    always names them too, so a log line alone is enough to fix the file.
    """

    def __init__(
        self,
        message: str,
        *,
        plugin: str | None = None,
        key: str | None = None,
        value: object = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        #: The plugin's id (from a config file) or its config name (from code).
        self.plugin = plugin
        self.key = key
        self.value = value
        #: The message without the plugin's name, for callers that name it themselves.
        self.reason = reason if reason is not None else message


class DuplicateToolError(GuardstackError, ValueError):
    """A tool name was registered twice in one registry."""


class ScriptExhaustedError(GuardstackError, RuntimeError):
    """A ``ScriptedModel`` was asked for more replies than its script holds."""


class SessionCorruptError(GuardstackError, ValueError):
    """A saved session log has a damaged line that is not its last."""


class TurnInProgressError(GuardstackError, RuntimeError):
    """``agent.prompt`` was called while the agent's previous turn still runs."""


class AgentLimitExceeded(GuardstackError, RuntimeError):
    """``AgentLimit`` refused to create one more agent."""


class ApprovalMismatch(GuardstackError, ValueError):
    """A decision names a call that is not pending, or was made on other arguments than
    the pending call's (its ``digest`` differs): the call stays pending."""


class StoreUnsupported(GuardstackError, RuntimeError):
    """A store used where it cannot work (``RedisStore`` on trio): a mistake, never an
    outage a layer would fail open or closed on."""


class SessionTailWarning(UserWarning):
    """A saved session's last line was cut off mid-write; the complete events loaded."""


class TurnBlocked(GuardstackError):
    """Raised by a ``model_call`` layer (a cap) to end the turn with reason ``blocked``.

    The loop logs the turn's end with ``error`` = this message, which names the
    limit; no further model request is sent. It is a signal, not a failure: a
    model-stage ``Retry`` never retries it.

    A cap that wraps up (``on_limit: wrap_up``) raises it with the turn's last answer:
    ``answer`` is the ``ModelReply`` to the request sent once more with its tools
    withheld, ``note`` the text that asked for it; the loop logs both, and the turn
    ends ``blocked`` with that answer as its text.
    """

    def __init__(self, message: str, *, answer: object = None, note: str | None = None) -> None:
        super().__init__(message)
        self.answer = answer
        self.note = note


class GuardstackWarning(UserWarning):
    """Something is probably wrong but nothing fails: a guard that cannot tell
    conversations apart, a stack whose order probably does not mean what you want."""
