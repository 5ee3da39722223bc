"""Durable agents on Temporal: each turn a workflow, each model call and tool attempt an activity.

::

    agent = TemporalAgent("researcher", tools=[search, fetch], model=model,
                          plugins=lambda: [Retry(attempts=3), ToolCallTimeoutPolicy(),
                                           RepeatToolReminder(), ToolCallLimit(per_turn=40)])
    async with worker(client, "agents", [agent]):                 # on every worker host
        conversation = Conversation(client, "researcher", "thread-1", "agents")
        result = await conversation.prompt("Find the TODOs")       # from any process

**What runs where.** The turn — the agent loop, the session log, caps, the
reminder, ``Retry`` and its backoff, every timeout — runs in the workflow, so it
is durable: a backoff or a per-attempt deadline is a Temporal timer, and a worker
that dies mid-turn costs nothing but the call in flight. Each model call and each
tool attempt is an activity, run by whichever worker picks it up.

**How order maps to Temporal's timeouts.** guardstack's layers keep their
meaning: a per-attempt timeout (inside a ``Retry``) is a workflow timer around one
activity, which it cancels when it fires; a whole-operation timeout (outside) is a
timer around all of them, backoff included. The activity's own options are derived
so that Temporal never decides in guardstack's place: start-to-close is the tool's
declared budget plus ``grace_ms`` (guardstack's timer always fires first, so the
model reads the seed's ``TOOL_TIMEOUT``, not an activity failure), a heartbeat
timeout of ``heartbeat_ms`` notices a lost worker, and the retry policy is one
attempt — guardstack alone retries, so every attempt is its own activity in the
history. A worker lost mid-call answers the call ``ABORTED`` (a ``Retry`` may run it
again elsewhere, never a tool declared ``idempotent=False``).

Refused at start-up (``ConfigError``): an engine limit (``start_to_close_cap_ms``)
shorter than a tool's budget plus grace, which would cut the budget so the model
never learns it timed out; and activity retries (``activity_attempts`` > 1) in a
stack with a ``Retry``, which would retry in two places.

Determinism: the guard stack is built inside the workflow by ``plugins()``; a
``Retry`` with jitter and no seed gets one from the workflow's random source, and
all time is the workflow's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Final

import attrs

from guardstack.integrations._extras import require
from guardstack.pipeline import (
    MODEL_FAILED,
    TOOL_ABORTED,
    TOOL_FAILED,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    Session,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
    Usage,
)
from guardstack.pipeline.approval import Decision, decision_from_dict, decision_to_dict
from guardstack.pipeline.ledger import Reservation, Settlement, Window
from guardstack.pipeline.outcome import Lost
from guardstack.pipeline.store import Admission
from guardstack.pipeline.values import failure_from_exception, message_of
from guardstack.wrappers import Retry

require("temporalio", "temporal")

from temporalio import activity, workflow  # noqa: E402
from temporalio.client import (  # noqa: E402
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.exceptions import ActivityError, ApplicationError  # noqa: E402
from temporalio.service import RPCError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402
from temporalio.workflow import ActivityCancellationType  # noqa: E402

__all__ = [
    "Conversation",
    "TemporalAgent",
    "TurnOutcome",
    "TurnWorkflow",
    "model_call",
    "serve",
    "store_operation",
    "tool_attempt",
    "worker",
]

OWNER: Final = "temporal"
TOOL_ACTIVITY: Final = "guardstack.tool"
MODEL_ACTIVITY: Final = "guardstack.model"
STORE_ACTIVITY: Final = "guardstack.store"
WORKFLOW: Final = "guardstack.turn"
#: How long an activity for a tool without a declared budget may run.
NO_BUDGET_MS: Final = 24 * 3_600_000


def _tools(tools: Sequence[ToolDefinition]) -> tuple[ToolDefinition, ...]:
    return tuple(tools)


def _no_plugins() -> Sequence[Any]:
    return ()


@attrs.frozen
class TemporalAgent:
    """An agent the workers can run: its real tools and model, and its guard stack."""

    name: str
    tools: tuple[ToolDefinition, ...] = attrs.field(converter=_tools)
    model: Any
    #: Builds the guard stack, in the workflow, for each turn (layers in onion order).
    plugins: Callable[[], Sequence[Any]] = _no_plugins
    max_steps: int = 50
    system: str | None = None
    grace_ms: int = 5_000
    heartbeat_ms: int = 10_000
    #: An engine limit on any activity's start-to-close (e.g. a namespace's maximum).
    start_to_close_cap_ms: int | None = None
    #: Temporal's own attempts per activity; 1 leaves retrying to guardstack.
    activity_attempts: int = 1
    #: Where the stack's keyed layers and caps keep their state (a ``RedisStore``): each
    #: store operation is a local activity on the worker, so every workflow and worker
    #: shares the limits and the workflow stays deterministic. ``None``: each turn's
    #: own memory store (limits that live for one turn).
    store: Any = attrs.field(default=None, kw_only=True)

    def tool(self, name: str) -> ToolDefinition:
        for definition in self.tools:
            if definition.name == name:
                return definition
        raise KeyError(name)

    def check(self) -> None:
        """Refuse a stack the engine would cut or retry twice (``ConfigError``)."""
        cap = self.start_to_close_cap_ms
        for tool in self.tools:
            if cap is not None and tool.timeout_ms is not None:
                needed = tool.timeout_ms + self.grace_ms
                if cap < needed:
                    raise ConfigError(
                        f"{OWNER}: agent {self.name!r}: start_to_close_cap_ms={cap} would cut "
                        f"tool {tool.name!r}'s {tool.timeout_ms} ms budget (it needs {needed} ms "
                        "with the grace period): the model would never learn it timed out",
                        plugin=OWNER,
                        key="start_to_close_cap_ms",
                        value=cap,
                    )
        if self.activity_attempts != 1 and any(isinstance(p, Retry) for p in self.plugins()):
            raise ConfigError(
                f"{OWNER}: agent {self.name!r}: activity_attempts={self.activity_attempts} with "
                "a Retry in the stack would retry in two places; keep activity_attempts=1",
                plugin=OWNER,
                key="activity_attempts",
                value=self.activity_attempts,
            )

    def activity_options(self, tool: ToolDefinition) -> dict[str, Any]:
        """Temporal's options for one attempt of ``tool``."""
        budget = tool.timeout_ms
        limit = NO_BUDGET_MS if budget is None else budget + self.grace_ms
        if self.start_to_close_cap_ms is not None:
            limit = min(limit, self.start_to_close_cap_ms)
        return {
            "start_to_close_timeout": timedelta(milliseconds=limit),
            "heartbeat_timeout": timedelta(milliseconds=self.heartbeat_ms),
            "retry_policy": RetryPolicy(maximum_attempts=self.activity_attempts),
            "cancellation_type": ActivityCancellationType.TRY_CANCEL,
        }


#: The agents this process's workers run, by name.
#: The agents served in this process, by task queue and name: two workers on different
#: queues may serve different agents under one name; one queue may not.
_AGENTS: dict[tuple[str, str], TemporalAgent] = {}


def _served(task_queue: str, name: str) -> TemporalAgent:
    return _AGENTS[(task_queue, name)]


# -- wire shapes -------------------------------------------------------------------------------


def _reply_to_wire(reply: ModelReply) -> dict[str, Any]:
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


def _reply_from_wire(wire: Mapping[str, Any]) -> ModelReply:
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
    spec = _served(activity.info().task_queue, agent)
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
    store = _served(activity.info().task_queue, agent).store
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


class _WorkflowStore:
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


@activity.defn(name=MODEL_ACTIVITY)
async def model_call(
    agent: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """One model call; a failure carries its ``ModelError`` code for the workflow's layers."""
    try:
        reply = await _served(activity.info().task_queue, agent).model.complete(messages, tools)
    except ModelError as error:
        raise ApplicationError(
            error.message, error.code, error.retry_after_s, type="ModelError", non_retryable=True
        ) from error
    except Exception as error:
        raise ApplicationError(
            message_of(error), MODEL_FAILED, None, type=type(error).__name__, non_retryable=True
        ) from error
    return _reply_to_wire(reply)


# -- the workflow ----------------------------------------------------------------------------


class _ActivityModel:
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
        return _reply_from_wire(wire)


def _activity_tool(spec: TemporalAgent, tool: ToolDefinition) -> Any:
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


def _deterministic(plugin: Any) -> Any:
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
        spec = _served(workflow.info().task_queue, request["agent"])
        store = _WorkflowStore(spec) if spec.store is not None else None
        harness = Harness(_ActivityModel(spec), spec.max_steps, system=spec.system, store=store)
        for tool in spec.tools:
            harness.tools.register(attrs.evolve(tool, execute=_activity_tool(spec, tool)))
        for plugin in spec.plugins():
            harness.plugin(_deterministic(plugin))
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


# -- workers and clients ------------------------------------------------------------------


@asynccontextmanager
async def worker(
    client: Client, task_queue: str, agents: Sequence[TemporalAgent], **options: Any
) -> AsyncIterator[Worker]:
    """A running Temporal worker for ``agents`` (checked first: a bad stack never starts)."""
    names = [agent.name for agent in agents]
    for agent in agents:
        agent.check()
        if names.count(agent.name) > 1:
            raise ConfigError(
                f"{OWNER}: two agents named {agent.name!r} for one worker; names pick the "
                "agent a turn runs, so each must be unique",
                key="agents",
                value=agent.name,
            )
        served = _AGENTS.get((task_queue, agent.name))
        if served is not None and served is not agent:
            raise ConfigError(
                f"{OWNER}: another agent named {agent.name!r} is already served on task queue "
                f"{task_queue!r} in this process; use another name or queue",
                key="agents",
                value=agent.name,
            )
    for agent in agents:
        _AGENTS[(task_queue, agent.name)] = agent
    running = Worker(
        client,
        task_queue=task_queue,
        workflows=[TurnWorkflow],
        activities=[tool_attempt, model_call, store_operation],
        **options,
    )
    try:
        async with running:
            yield running
    finally:
        for agent in agents:
            if _AGENTS.get((task_queue, agent.name)) is agent:
                del _AGENTS[(task_queue, agent.name)]


@attrs.frozen
class TurnOutcome:
    """What a turn ended with, and the conversation's log after it."""

    reason: str
    text: str
    error: str | None
    log: str

    def session(self) -> Session:
        return Session.from_jsonl(self.log)


class Conversation:
    """Start or continue a conversation by id: each prompt is one workflow, ``{id}/turn-{n}``."""

    def __init__(self, client: Client, agent: str, conversation_id: str, task_queue: str) -> None:
        self.client = client
        self.agent = agent
        self.conversation_id = conversation_id
        self.task_queue = task_queue
        self.turns = 0
        self.log: str | None = None
        #: The workflow id of a turn ``resume()`` found still running, if any.
        self.running: str | None = None

    async def resume(self) -> Conversation:
        """Pick up after the last finished turn recorded in Temporal, if any.

        Never waits for a turn still running: ``running`` then names its workflow id (its
        result is the next thing to wait for), and ``turns`` counts those before it.
        """
        self.running = None
        while True:
            handle = self.client.get_workflow_handle(self._workflow_id(self.turns + 1))
            try:
                described = await handle.describe()
            except RPCError:
                return self
            if described.status == WorkflowExecutionStatus.RUNNING:
                self.running = handle.id
                return self
            try:
                wire = await handle.result()
            except (RPCError, WorkflowFailureError):
                return self  # a turn that failed: nothing after it to continue from
            self.turns += 1
            self.log = wire["log"]

    def _workflow_id(self, turn: int) -> str:
        return f"{self.conversation_id}/turn-{turn}"

    async def pending(self) -> list[dict[str, Any]]:
        """The calls the running turn waits on a decision for (``[]`` if none)."""
        handle = self.client.get_workflow_handle(self._workflow_id(self.turns + 1))
        try:
            found: list[dict[str, Any]] = await handle.query("pending")
        except RPCError:
            return []
        return found

    async def decide(self, decisions: Mapping[str, Decision | Mapping[str, Any]]) -> None:
        """Send the running turn decisions by call id (``Approve()``, ``Reject(reason)``,
        ``Edit(arguments)`` or their dict form): it resumes when one it waits on comes."""
        handle = self.client.get_workflow_handle(self._workflow_id(self.turns + 1))
        wire = {
            call_id: decision_to_dict(decision_from_dict(decision, OWNER))
            for call_id, decision in decisions.items()
        }
        await handle.signal("decide", wire)

    async def prompt(self, text: str) -> TurnOutcome:
        """Run one turn; a turn paused for approval finishes once ``decide`` (from this
        client or any other) has decided what it waits on."""
        wire = await self.client.execute_workflow(
            TurnWorkflow.run,
            {
                "agent": self.agent,
                "conversation": self.conversation_id,
                "log": self.log,
                "prompt": text,
            },
            id=self._workflow_id(self.turns + 1),
            task_queue=self.task_queue,
        )
        self.turns += 1
        self.log = wire["log"]
        return TurnOutcome(wire["reason"], wire["text"], wire["error"], wire["log"])


async def serve(
    agents: Sequence[str],
    task_queue: str,
    *,
    address: str = "localhost:7233",
    namespace: str = "default",
    sticky_timeout_s: float = 10.0,
) -> None:
    """``guardstack worker``: import each ``module:function``, serve its agent until stopped."""
    import importlib

    made = []
    for reference in agents:
        module, _, attribute = reference.partition(":")
        if not module or not attribute:
            raise ConfigError(
                f"{OWNER}: {reference!r} is not module:function", key="agents", value=reference
            )
        agent = getattr(importlib.import_module(module), attribute)()
        if not isinstance(agent, TemporalAgent):
            raise ConfigError(
                f"{OWNER}: {reference} returned {agent!r}, not a TemporalAgent",
                key="agents",
                value=reference,
            )
        made.append(agent)
    client = await Client.connect(address, namespace=namespace)
    async with worker(
        client,
        task_queue,
        made,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_timeout_s),
    ):
        names = ", ".join(agent.name for agent in made)
        print(f"worker ready: {names} on {task_queue} at {address}", flush=True)
        await asyncio.Event().wait()
