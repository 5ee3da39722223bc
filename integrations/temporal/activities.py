"""The activities: one tool attempt, one model call, one store operation — each run on a
worker, outside the workflow's history."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

import attrs

from guardstack.integrations._extras import require
from guardstack.integrations.temporal.agent import (
    MODEL_ACTIVITY,
    STORE_ACTIVITY,
    TOOL_ACTIVITY,
    served,
)
from guardstack.pipeline import (
    MODEL_FAILED,
    ModelError,
    ModelReply,
    ToolCall,
    ToolCallRequest,
    ToolRegistry,
    Usage,
)
from guardstack.pipeline.ledger import Reservation, Window
from guardstack.pipeline.store import Admission
from guardstack.pipeline.values import failure_from_exception, message_of

require("temporalio", "temporal")

from temporalio import activity  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402

# -- wire shapes -------------------------------------------------------------------------------


def reply_to_wire(reply: ModelReply) -> dict[str, Any]:
    usage = reply.usage
    return {
        "text": reply.text,
        "tool_calls": [
            {"name": c.name, "arguments": c.arguments_json, "call_id": c.call_id}
            for c in reply.tool_calls
        ],
        "usage": attrs.asdict(usage) if usage is not None else None,
        "reasoning": reply.reasoning,
        "model": reply.model,
        "finish_reason": reply.finish_reason,
    }


def reply_from_wire(wire: Mapping[str, Any]) -> ModelReply:
    usage = wire.get("usage")
    return ModelReply(
        wire.get("text") or "",
        tuple(
            ToolCallRequest(c["name"], c["arguments"], c.get("call_id") or "")
            for c in wire.get("tool_calls") or ()
        ),
        Usage(**usage) if usage else None,
        wire.get("reasoning"),
        wire.get("model"),
        wire.get("finish_reason"),
    )


# -- activities ----------------------------------------------------------------------------


@activity.defn(name=TOOL_ACTIVITY)
async def tool_attempt(agent: str, name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    """One attempt of a tool, heartbeating while it runs; any failure becomes a result."""
    spec = served(activity.info().task_queue, agent)
    registry = ToolRegistry()
    registry.register(spec.tool(name))
    interval = max(spec.heartbeat_ms / 4000, 0.05)

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    beating = asyncio.create_task(beat())
    try:
        outcome = await registry.execute(ToolCall(name, arguments, call_id))
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # a tool's KeyboardInterrupt-like: the tool failed, the
        # worker did not (an ABORTED "worker lost" result would invite a retry to run it again)
        return failure_from_exception(error).to_dict()
    finally:
        beating.cancel()
    return outcome.result.to_dict()


@activity.defn(name=STORE_ACTIVITY)
async def store_operation(
    agent: str, operation: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """One store operation on the worker's real store (a local activity of the workflow)."""
    store = served(activity.info().task_queue, agent).store
    if operation not in _STORE_OPERATIONS or store is None:
        raise ApplicationError(f"no store operation {operation!r}", non_retryable=True)
    if operation in ("reserve", "balance"):  # windows travel as mappings
        windows = [Window(**window) for window in args[-1 if operation == "reserve" else 0]]
        args = [*args[:-1], windows] if operation == "reserve" else [windows[0]]
    answer = await getattr(store, operation)(*args, **kwargs)
    if isinstance(answer, Admission):
        return {"admitted": answer.admitted, "wait_s": answer.wait_s, "probe": answer.probe}
    if isinstance(answer, Reservation):
        refused = None if answer.window is None else attrs.asdict(answer.window)
        return {**attrs.asdict(answer), "window": refused}
    return list(answer) if isinstance(answer, tuple) else answer


_STORE_OPERATIONS: Final = frozenset(
    {
        "take",
        "admit",
        "record",
        "release_probe",
        "acquire",
        "release_slot",
        "add",
        "read",
        "read_limit",
        "swap_limit",
        "reserve",
        "settle",
        "release",
        "balance",
        "close",
    }
)


@activity.defn(name=MODEL_ACTIVITY)
async def model_call(
    agent: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """One model call; a failure carries its ``ModelError`` code for the workflow's layers."""
    try:
        reply = await served(activity.info().task_queue, agent).model.complete(messages, tools)
    except ModelError as error:
        raise ApplicationError(
            error.message, error.code, error.retry_after_s, type="ModelError", non_retryable=True
        ) from error
    except Exception as error:
        raise ApplicationError(
            message_of(error), MODEL_FAILED, None, type=type(error).__name__, non_retryable=True
        ) from error
    return reply_to_wire(reply)
