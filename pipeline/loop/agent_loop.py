"""``AgentLoop``: the tools, the model stage and the hooks its agents share; ``create``
makes an agent."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, cast

import anyio
import anyio.lowlevel

from guardstack.pipeline.contract import ModelLayer, ModelNext, PromptLayer, PromptNext, TurnRun
from guardstack.pipeline.errors import (
    ConfigError,
)
from guardstack.pipeline.model import (
    Model,
    ModelReply,
    ModelRequest,
    Usage,
    reports_chunks,
)
from guardstack.pipeline.model_members import StreamingModel
from guardstack.pipeline.onion import Pipeline, Registration
from guardstack.pipeline.session import (
    Session,
    SystemMessage,
)
from guardstack.pipeline.signals import USAGE_TOKENS, Signals
from guardstack.pipeline.tree import TreeLedger
from guardstack.pipeline.validate import integer, invalid

if TYPE_CHECKING:
    from guardstack.pipeline.registry import ToolRegistry
from guardstack.pipeline.loop.agent import Agent

logger = logging.getLogger("guardstack")


async def submit(agent: Agent, text: str) -> str:
    return text


async def complete(request: ModelRequest) -> ModelReply:
    """The innermost ``model_call`` layer: the agent's model itself (told of each piece
    of its reply when a layer listens and the model reports them)."""
    model = request.model if request.model is not None else request.agent.model
    on_chunk = request.on_chunk
    if on_chunk is not None and reports_chunks(model):
        streaming = cast(StreamingModel, model)  # it says it reports chunks
        reply: ModelReply = await streaming.complete(
            request.messages, request.tools, on_chunk=on_chunk
        )
        return reply
    return await model.complete(request.messages, request.tools)


class AgentLoop:
    """Creates agents that share one tool registry and run turns."""

    def __init__(
        self,
        tools: ToolRegistry,
        model: Model | None = None,
        max_steps: int = 50,
        max_parallel_tool_calls: int = 1,
        *,
        system: str | None = None,
    ) -> None:
        self.tools = tools
        self.model = model
        self.max_steps = integer("AgentLoop", "max_steps", max_steps)
        self.max_parallel_tool_calls = integer(
            "AgentLoop", "max_parallel_tool_calls", max_parallel_tool_calls
        )
        self.system = _system_prompt(system)
        #: ``async (agent, text, call_next) -> text``: sees every new person's prompt.
        self.prompt_submit: Pipeline[PromptNext, PromptLayer] = Pipeline(
            submit, stage="prompt_submit", arity=2
        )
        #: ``async (request, call_next) -> ModelReply``: every model call of every agent.
        self.model_call: Pipeline[ModelNext, ModelLayer] = Pipeline(
            complete, stage="model", arity=1
        )
        self.turn_hooks: list[Callable[[TurnRun], TurnRun]] = []
        self._model_hooks: list[Callable[[ModelNext], ModelNext]] = []
        # the stage's own bound ``__call__``, not one of the loop's: no reference cycle
        #: The model stage wrapped in every ``instrument_model_call`` hook, or ``None``
        #: when there is none (then ``model_call.entry`` is the whole of it).
        self.hooked_model_call: ModelNext | None = None
        self._create_hooks: list[Callable[[Agent], None]] = []
        self.turn_end_hooks: list[Callable[[Agent], Awaitable[None]]] = []
        #: What a tree of agents counts at this loop's agents (``AgentTool``'s children).
        self.tree = TreeLedger()
        #: Where the layers report events and resilience metrics (``Tracing``, ``Metrics``).
        self.signals = Signals()
        #: Whose a model call is, when a plugin says (a ``UsageLimit`` that names its
        #: tenant): the usage metric then names the tenant its spend is counted for.
        self.tenant_of: Callable[[Agent, ModelRequest | None], str | None] | None = None

    def charge(self, agent: Agent, usage: Usage, request: ModelRequest | None = None) -> None:
        """Count a reply's usage for ``agent`` (its session and turn), and as
        ``guardstack.usage.tokens`` for its tenant: the one a cap that names tenants
        counts the call's spend for (``tenant_of``), else the agent's."""
        agent.add_usage(usage)
        resolver = self.tenant_of
        tenant = resolver(agent, request) if resolver is not None else None
        tenant = tenant or getattr(agent, "tenant", None) or "default"
        signals = self.signals
        signals.add(
            USAGE_TOKENS, usage.input_tokens, {"tenant": tenant, "gen_ai.token.type": "input"}
        )
        signals.add(
            USAGE_TOKENS, usage.output_tokens, {"tenant": tenant, "gen_ai.token.type": "output"}
        )

    def instrument_turn(self, hook: Callable[[TurnRun], TurnRun]) -> Registration:
        """Wrap every whole turn (``async (agent, text) -> TurnResult``) with ``hook``.

        For instrumentation such as ``Tracing``'s ``invoke_agent`` span; the turn's
        own work, the log and the result are unchanged by it.
        """
        self.turn_hooks.append(hook)
        return Registration(lambda: self.turn_hooks.remove(hook))

    async def call_model(self, request: ModelRequest) -> ModelReply:
        """One model call through the whole ``model_call`` stage: every layer, and every
        hook (``instrument_model_call``: ``Tracing``'s ``chat`` span, ``BudgetNotice``).
        The entrance for hosts that make model calls outside a turn (the model proxy,
        a child agent's calls charged to its parent)."""
        return await (self.hooked_model_call or self.model_call.entry)(request)

    def on_turn_end(self, hook: Callable[[Agent], Awaitable[None]]) -> Registration:
        """Call ``await hook(agent)`` when one of this loop's agents' turns has ended
        (not when it paused for approval: it goes on later). Caps close the turn's
        windows here."""
        self.turn_end_hooks.append(hook)
        return Registration(lambda: self.turn_end_hooks.remove(hook))

    async def turn_ended(self, agent: Agent) -> None:
        """Tell the turn-end hooks that ``agent``'s turn is over (shielded; a hook that
        raises is logged, never raised). The loop calls it after each turn; a host that
        runs turns of its own (the model proxy's conversations) calls it itself."""
        if not self.turn_end_hooks:
            return
        with anyio.CancelScope(shield=True):
            for hook in tuple(self.turn_end_hooks):
                try:
                    await hook(agent)
                except Exception:
                    logger.warning("a turn-end hook failed", exc_info=True)

    def instrument_model_call(self, hook: Callable[[ModelNext], ModelNext]) -> Registration:
        """Wrap every whole model call (the ``model_call`` stage, all its layers) with ``hook``."""
        self._model_hooks.append(hook)
        self._compose_model_call()

        def remove() -> None:
            self._model_hooks.remove(hook)
            self._compose_model_call()

        return Registration(remove)

    def _compose_model_call(self) -> None:
        call: ModelNext = self.model_call.__call__
        for hook in reversed(self._model_hooks):
            call = hook(call)
        self.hooked_model_call = call if self._model_hooks else None

    def on_create(self, hook: Callable[[Agent], None]) -> Registration:
        """Run ``hook(agent)`` before ``create`` returns; if it raises, ``create`` raises."""
        self._create_hooks.append(hook)
        return Registration(lambda: self._create_hooks.remove(hook))

    def create(
        self,
        session_id: str,
        model: Model | None = None,
        *,
        session: Session | None = None,
        system: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        labels: Mapping[str, str] | None = None,
    ) -> Agent:
        """A new agent. ``session`` resumes a loaded log; guard state starts fresh.

        ``system`` (else the loop's) is logged as a new session's first event; a
        resumed session keeps its own, and naming a different one raises. ``tenant``
        (whose windows and fair share its calls count in) and ``priority`` (its calls'
        place in admission queues, higher first) are the agent's from the start, for
        every layer that reads them (``agent.tenant``, ``agent.priority``). ``labels``
        name whose the agent is beyond its tenant (a gateway's ``team`` and
        ``key_name``): every decision-log line about it carries them.
        """
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise invalid("AgentLoop.create", "tenant", tenant, "a tenant's name (text)")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise invalid("AgentLoop.create", "priority", priority, "a whole number")
        chosen = model if model is not None else self.model
        if chosen is None:
            raise ConfigError(
                "AgentLoop.create: no model; pass model= here or to AgentLoop",
                key="model",
                value=None,
            )
        log = session if session is not None else Session(session_id)
        _start_with_system(log, _system_prompt(system) or self.system)
        if labels is not None and not (
            isinstance(labels, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        ):
            raise invalid("AgentLoop.create", "labels", labels, "a mapping of text to text")
        agent = Agent(self, log, chosen, tenant=tenant, priority=priority, labels=labels)
        for hook in list(self._create_hooks):
            hook(agent)
        return agent


def _system_prompt(system: object) -> str | None:
    if system is not None and not isinstance(system, str):
        raise ConfigError(
            f"AgentLoop: `system` must be text, got {type(system).__name__}",
            key="system",
            value=system,
        )
    return system or None


def _start_with_system(session: Session, system: str | None) -> None:
    """Log ``system`` as the first event of a new session; check it against a resumed one."""
    if system is None:
        return
    if not session.events:
        session.append(SystemMessage(system))
        return
    if session.system != system:
        had = "a different system prompt" if session.system else "no system prompt"
        raise ConfigError(
            f"session {session.session_id!r} started with {had}; a log is never rewritten, "
            "so resume it with the system prompt it has (system=None keeps it)",
            key="system",
            value=system,
        )
