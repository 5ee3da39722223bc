"""``TurnWorkflow``: one turn of an agent, run deterministically — its model, tools and
store reached through activities."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs

from guardstack.integrations._extras import require
from guardstack.integrations.temporal.activities import (
    model_call,
    reply_from_wire,
    store_operation,
    tool_attempt,
)
from guardstack.integrations.temporal.agent import (
    NO_BUDGET_MS,
    OWNER,
    WORKFLOW,
    TemporalAgent,
    served,
)
from guardstack.pipeline import (
    MODEL_FAILED,
    TOOL_ABORTED,
    TOOL_FAILED,
    Harness,
    ModelError,
    Session,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from guardstack.pipeline.approval import decision_from_dict
from guardstack.pipeline.ledger import Reservation, Settlement, Window
from guardstack.pipeline.outcome import Lost
from guardstack.pipeline.store import Admission
from guardstack.pipeline.values import message_of
from guardstack.wrappers import Retry

require("temporalio", "temporal")

from temporalio import workflow  # noqa: E402
from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.exceptions import ActivityError, ApplicationError  # noqa: E402
from temporalio.workflow import ActivityCancellationType  # noqa: E402


class WorkflowStore:
    """The workflow's view of an agent's store: every operation a local activity."""

    suspends = True

    def __init__(self, spec: TemporalAgent) -> None:
        self.spec = spec
        self.name = getattr(spec.store, "name", "store")
        self.on_error = getattr(spec.store, "on_error", None)
        self.poll_s = getattr(spec.store, "poll_s", None)

    async def _run(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        return await workflow.execute_local_activity(
            store_operation,
            args=[self.spec.name, operation, list(args), kwargs],
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )

    async def take(self, key: str, per_second: float, burst: float, amount: float = 1.0) -> float:
        return float(await self._run("take", key, per_second, burst, amount))

    async def admit(self, key: str, break_s: float) -> Admission:
        answer = await self._run("admit", key, break_s)
        return Admission(bool(answer["admitted"]), float(answer["wait_s"]), bool(answer["probe"]))

    async def record(self, key: str, failed: bool, probe: bool, **window: Any) -> Any:
        return await self._run("record", key, failed, probe, **window)

    async def release_probe(self, key: str) -> None:
        await self._run("release_probe", key)

    async def acquire(self, key: str, limit: int) -> str | None:
        answer = await self._run("acquire", key, limit)
        return None if answer is None else str(answer)

    async def release_slot(self, key: str, lease: str) -> None:
        await self._run("release_slot", key, lease)

    async def add(
        self, key: str, amount: float, *, limit: float | None = None, initial: float = 0.0
    ) -> tuple[bool, float]:
        added, total = await self._run("add", key, amount, limit=limit, initial=initial)
        return bool(added), float(total)

    async def read(self, key: str) -> float:
        return float(await self._run("read", key))

    async def read_limit(self, key: str, initial: float) -> tuple[float, int]:
        value, version = await self._run("read_limit", key, initial)
        return float(value), int(version)

    async def swap_limit(
        self, key: str, version: int, value: float, low: float, high: float, *, bump: bool
    ) -> tuple[float, int]:
        answer = await self._run("swap_limit", key, version, value, low, high, bump=bump)
        return float(answer[0]), int(answer[1])

    # the ledger: what the caps count, on the worker's store

    async def reserve(
        self,
        op_id: str,
        amounts: Mapping[str, float],
        windows: Sequence[Window],
        *,
        lease_s: float | None = None,
    ) -> Reservation:
        wire = [attrs.asdict(window) for window in windows]
        answer = await self._run("reserve", op_id, dict(amounts), wire, lease_s=lease_s)
        refused = answer["window"]
        return Reservation(
            answer["op_id"],
            bool(answer["granted"]),
            None if refused is None else Window(**refused),
            float(answer["used"]),
            bool(answer["duplicate"]),
        )

    async def settle(self, op_id: str, actual: Mapping[str, float]) -> Settlement:
        answer: Settlement = await self._run("settle", op_id, dict(actual))
        return answer

    async def release(self, op_id: str) -> Settlement:
        answer: Settlement = await self._run("release", op_id)
        return answer

    async def balance(self, window: Window) -> float:
        return float(await self._run("balance", [attrs.asdict(window)]))

    async def close(self, keys: Sequence[str]) -> None:
        await self._run("close", list(keys))


# -- the workflow ----------------------------------------------------------------------------


class ActivityModel:
    """The agent's model, as seen from the workflow: each call an activity."""

    def __init__(self, spec: TemporalAgent) -> None:
        self.spec = spec
        self.model = getattr(spec.model, "model", None)

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        handle = workflow.start_activity(
            model_call,
            args=[self.spec.name, messages, tools],
            start_to_close_timeout=timedelta(milliseconds=NO_BUDGET_MS),
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=ActivityCancellationType.TRY_CANCEL,
        )
        try:
            wire = await asyncio.shield(handle)  # see the tool's: a model timeout cancels it
        except asyncio.CancelledError:
            handle.cancel()
            raise
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.type == "ModelError":
                code, retry_after = [*cause.details, MODEL_FAILED, None][:2]
                raise ModelError(cause.message, str(code), retry_after) from None
            raise ModelError(message_of(cause or error), MODEL_FAILED) from None
        return reply_from_wire(wire)


def activity_tool(spec: TemporalAgent, tool: ToolDefinition) -> Any:
    """The tool as the workflow runs it: one activity per attempt."""
    options = spec.activity_options(tool)

    async def execute(arguments: Any, call: ToolCall) -> ToolResult:
        handle = workflow.start_activity(
            tool_attempt, args=[spec.name, tool.name, dict(arguments), call.call_id], **options
        )
        try:
            # Shielded: a guardstack timeout cancels this await at once and asks Temporal to
            # cancel the activity, instead of waiting inside the activation for it to stop
            # (anyio would redeliver its cancellation until then: a workflow deadlock).
            wire = await asyncio.shield(handle)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        except ActivityError as error:
            why = message_of(error.cause or error)
            if isinstance(error.cause, ApplicationError):  # it raised: a failure, not a loss
                return ToolResult.failure(
                    f"the tool failed in its activity ({why})",
                    name=error.cause.type or "ApplicationError",
                    code=TOOL_FAILED,
                )
            lost = ToolResult.failure(
                f"the worker running the tool was lost ({why})",
                name="WorkerLost",
                code=TOOL_ABORTED,
            )
            # a provider-side failure, not guardstack's own abort: a Retry may run an
            # idempotent tool again, on another worker
            return attrs.evolve(lost, value=Lost(why))
        return ToolResult.from_dict(wire)

    execute.__name__ = f"temporal_{tool.name}"
    return execute


def deterministic(plugin: Any) -> Any:
    """A plugin whose random draws come from the workflow's random source."""
    if isinstance(plugin, Retry) and plugin.jitter and plugin.seed is None:
        return attrs.evolve(plugin, seed=workflow.random().randint(0, 2**31 - 1))
    return plugin


@workflow.defn(name=WORKFLOW, sandboxed=False)
class TurnWorkflow:
    """One turn of one conversation: the guard stack and the loop, durably.

    A turn that pauses for approval (``guards.Approval`` with no approver) waits for
    the ``decide`` signal — as long as it takes, as a durable wait — and goes on with
    the decisions; the ``pending`` query lists what waits.
    """

    def __init__(self) -> None:
        self._decisions: dict[str, Any] = {}
        self._pending: list[dict[str, Any]] = []

    @workflow.signal(name="decide")
    async def decide(self, decisions: dict[str, Any]) -> None:
        """Decisions by call id, each in its dict form (``decision_to_dict``)."""
        self._decisions.update(decisions)

    @workflow.query(name="pending")
    def pending(self) -> list[dict[str, Any]]:
        return list(self._pending)

    async def _decided(self, agent: Any, result: Any) -> Any:
        """Wait for decisions on the paused calls, resume, until the turn ends otherwise."""
        while result.reason == "approval":
            self._pending = [
                {
                    "call_id": p.call_id,
                    "tool": p.tool,
                    "arguments": dict(p.arguments),
                    "digest": p.digest,
                    "reason": p.reason,
                }
                for p in result.pending
            ]
            waiting = {p.call_id for p in result.pending}
            await workflow.wait_condition(
                lambda waiting=waiting: bool(waiting & set(self._decisions))  # type: ignore[misc]
            )
            chosen = {
                call_id: decision_from_dict(self._decisions.pop(call_id), OWNER)
                for call_id in list(self._decisions)
                if call_id in waiting
            }
            self._pending = []
            result = await agent.resume(chosen)
        return result

    @workflow.run
    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        spec = served(workflow.info().task_queue, request["agent"])
        store = WorkflowStore(spec) if spec.store is not None else None
        harness = Harness(ActivityModel(spec), spec.max_steps, system=spec.system, store=store)
        for tool in spec.tools:
            harness.tools.register(attrs.evolve(tool, execute=activity_tool(spec, tool)))
        for plugin in spec.plugins():
            harness.plugin(deterministic(plugin))
        log = request.get("log")
        session = Session.from_jsonl(log) if log else None
        agent = harness.loop.create(request["conversation"], session=session)
        try:
            result = await self._decided(agent, await agent.prompt(request["prompt"]))
        except asyncio.CancelledError:
            # Cancelled from the client: the loop has answered every call ABORTED and ended
            # the turn, so the log is whole — hand it back, or the prompt would be lost.
            return {
                "log": agent.session.to_jsonl(),
                "reason": "aborted",
                "text": "",
                "error": "the turn's workflow was cancelled",
            }
        return {
            "log": agent.session.to_jsonl(),
            "reason": result.reason,
            "text": result.text,
            "error": result.error,
        }
