"""``guardstack check CONFIG``: what a stack means, layer by layer, and what looks wrong.

``check(harness)`` reads the plugins in the order they were applied (the onion's
order) and returns one plain sentence per plugin, saying what it covers *given
its position*, plus warnings for stacks that are probably not what was meant:

* a tool declares a budget, but no timeout layer applies it;
* a whole-operation timeout outside a retry is no longer than one attempt's
  budget inside it, so the retry can never run;
* a retry waits for an error code no layer produces (a misspelt code);
* a retry with no per-attempt timeout inside it, for tools that declare budgets;
* metrics inside a retry (they count attempts, not operations);
* a circuit breaker inside a retry (it counts attempts: one failing operation
  counts several times — resilience4j's warning);
* chaos in the stack (it injects faults on purpose);
* a tool's own budget applied outside a retry that retries ``TOOL_TIMEOUT`` (the
  retry can never retry that timeout);
* no cap on tool calls, model calls or usage; no loop guard (the reminder or
  ``LoopDetector``).

Call it from your own tests (``assert not check(harness).warnings``); the command
prints it and, with ``--strict``, exits 1 on a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from guardstack.guards import (
    AgentLimit,
    Approval,
    BudgetNotice,
    LoopDetector,
    ModelCallLimit,
    RepeatToolReminder,
    ToolCallLimit,
    ToolCallTimeoutPolicy,
    TurnDeadline,
    UsageLimit,
)
from guardstack.pipeline.agent_tool import is_agent_tool
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.model_members import model_name_of
from guardstack.pipeline.values import (
    INVALID_ARGUMENTS,
    TOOL_ABORTED,
    TOOL_DENIED,
    TOOL_FAILED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    UNKNOWN_TOOL,
)
from guardstack.wrappers import (
    AdaptiveConcurrencyLimit,
    Chaos,
    CircuitBreaker,
    ConcurrencyLimit,
    Fallback,
    Hedge,
    Metrics,
    RateLimit,
    Retry,
    Timeout,
    TokenRateLimit,
    Tracing,
)

__all__ = ["Report", "check"]

#: Codes a tool stack can produce without any layer: the registry's own.
_REGISTRY_CODES = frozenset({TOOL_FAILED, UNKNOWN_TOOL, INVALID_ARGUMENTS, TOOL_ABORTED})


@attrs.frozen
class Report:
    """What each plugin means where it sits, and the warnings."""

    lines: tuple[str, ...]
    warnings: tuple[str, ...]

    def render(self) -> str:
        text = [f"{number}. {line}" for number, line in enumerate(self.lines, start=1)]
        text += [f"warning: {warning}" for warning in self.warnings] or ["no warnings"]
        return "\n".join(text)


def _timeout_on_tools(plugin: object) -> bool:
    if isinstance(plugin, ToolCallTimeoutPolicy):
        return True
    return isinstance(plugin, Timeout) and plugin.stage == "dispatch"


def _stage(plugin: object) -> str:
    return str(getattr(plugin, "stage", "dispatch"))


#: What ``check`` adds to the line of a plugin in shadow mode.
SHADOW_NOTE = (
    " — IN SHADOW: it decides as usual but only records what it would do "
    "(guardstack.shadow.decisions); every call goes through"
)


def check(harness: Harness) -> Report:
    """Explain ``harness``'s stack plugin by plugin, and warn about likely mistakes."""
    plugins = [handle.plugin for handle in harness.plugins]
    budgets = {
        name: tool.timeout_ms
        for name in (definition["function"]["name"] for definition in harness.tools.schemas())
        if (tool := harness.tools.get(name)) is not None and tool.timeout_ms is not None
    }
    lines: list[str] = []
    warnings: list[str] = []
    for stage in ("dispatch", "model"):
        on_stage = [p for p in plugins if _stage(p) == stage and not isinstance(p, Tracing)]
        retry_at = next((i for i, p in enumerate(on_stage) if isinstance(p, Retry)), None)
        for index, plugin in enumerate(on_stage):
            inside = retry_at is not None and index > retry_at
            outside = retry_at is not None and index < retry_at
            line = _explain(plugin, inside, outside, stage)
            if getattr(plugin, "shadow", False) is True:
                line += SHADOW_NOTE
            lines.append(line)
    for plugin in plugins:
        if isinstance(plugin, Tracing):
            lines.append("tracing: a span per call and per layer; it has no position of its own")
    warnings += _budget_warnings(plugins, budgets)
    warnings += _retry_warnings(plugins, budgets)
    if not any(isinstance(p, ToolCallLimit | ModelCallLimit | UsageLimit) for p in plugins):
        warnings.append(
            "no cap: nothing limits tool calls, model calls or tokens per turn (only max_steps="
            f"{harness.loop.max_steps}); add tool-call-limit, model-call-limit or usage-limit"
        )
    if any(isinstance(p, Chaos) for p in plugins):
        warnings.append("chaos injects faults on purpose: for tests and game days, not production")
    if not any(isinstance(p, RepeatToolReminder | LoopDetector) for p in plugins):
        warnings.append("no loop guard: neither repeat-tool-reminder nor loop-detector is applied")
    warnings.extend(_tree_warnings(harness, plugins))
    warnings.extend(_approval_warnings(plugins))
    warnings.extend(_price_warnings(plugins))
    return Report(tuple(lines), tuple(warnings))


def _price_warnings(plugins: list[object]) -> list[str]:
    """Models the stack names (a downgrade's, a fallback's) that a dollar limit has no
    price for: they would be charged at its highest price."""
    from guardstack.wrappers import Fallback

    named: set[str] = set()
    for plugin in plugins:
        if isinstance(plugin, UsageLimit) and plugin.downgrade is not None:
            to = plugin.downgrade["to"]
            if isinstance(to, str):
                named.add(to)
        if isinstance(plugin, Fallback):
            for target in plugin.targets:
                model = target.get("model") if isinstance(target, Mapping) else None
                if isinstance(model, str):
                    named.add(model)
    found = []
    for plugin in plugins:
        if isinstance(plugin, UsageLimit) and plugin.prices_needed and plugin.prices:
            for model in sorted(named - set(plugin.prices)):
                found.append(
                    f"{plugin.name}: no price for model {model!r}, which this stack names: "
                    "its calls would be charged at the highest price in `prices`; add it there"
                )
    return found


def _explain(plugin: object, inside: bool, outside: bool, stage: str) -> str:
    what = "each model call" if stage == "model" else "each tool call"
    if isinstance(plugin, Timeout | ToolCallTimeoutPolicy):
        ms = getattr(plugin, "ms", None)
        budget = f"{ms} ms" if ms is not None else "the tool's own declared budget"
        name = plugin.name
        if isinstance(plugin, Timeout) and (plugin.first_byte_ms or plugin.idle_ms):
            budget += _stream_bounds(plugin, stage)
        if outside:
            return f"{name}: bounds the whole retried operation, backoff included, at {budget}"
        if inside:
            return f"{name}: bounds each attempt at {budget}"
        return f"{name}: bounds {what} at {budget}"
    if isinstance(plugin, Retry):
        codes = "a predicate" if callable(plugin.retry_on) else ", ".join(sorted(plugin.retry_on))
        return (
            f"retry: runs the layers after it again, up to {plugin.attempts} attempts, on {codes}"
        )
    if isinstance(plugin, Metrics):
        if inside:
            return "metrics: counts attempts (it is inside the retry), not operations"
        return f"metrics: counts operations — {what} once, however many attempts"
    resilience = _explain_resilience(plugin, inside, outside, what)
    if resilience is not None:
        return resilience
    if isinstance(plugin, ToolCallLimit):
        return f"tool-call-limit: {plugin.on_exceeded} past {plugin.per_turn or '-'} calls a turn"
    if isinstance(plugin, RepeatToolReminder):
        return (
            f"repeat-tool-reminder: reminds at {list(plugin.thresholds)} identical calls in a row"
        )
    if isinstance(plugin, UsageLimit) and plugin.downgrade is not None:
        to = plugin.downgrade["to"]
        name = to if isinstance(to, str) else model_name_of(to) or repr(to)
        return (
            f"{plugin.name}: past {plugin.downgrade['at']:.0%} of a window the cheaper model "
            f"{name} answers; ends the turn blocked at its limit, before the next model request"
        )
    if isinstance(plugin, ModelCallLimit | UsageLimit):
        return f"{plugin.name}: ends the turn blocked at its limit, before the next model request"
    if isinstance(plugin, LoopDetector):
        patterns = _those_set(
            "{} at {}",
            identical=plugin.identical,
            cycle=plugin.cycle,
            no_progress=plugin.no_progress,
            repeated_error=plugin.repeated_error,
            poll=plugin.poll,
            walking=plugin.walking,
            monologue=plugin.monologue,
        )
        ladder = _those_set(
            "{} at detection {}",
            **{"remind": plugin.remind, "deny": plugin.deny, "end the turn": plugin.end_turn},
        )
        compared = "volatile fields masked" if plugin.volatile else "compared exactly"
        return (
            f"loop-detector: watches for loops ({patterns}; {compared}); {ladder}; "
            "a new prompt resets it"
        )
    if isinstance(plugin, TurnDeadline):
        return (
            f"turn-deadline: the whole turn has {plugin.ms} ms; every call in it sees that "
            "deadline, and the turn ends with reason deadline when it passes"
        )
    if isinstance(plugin, AgentLimit):
        bounds = _those_set(
            "{1} {0}",
            **{
                "agents in all": plugin.max_agents,
                "levels deep": plugin.max_depth,
                "children per agent per turn": plugin.max_children,
            },
        )
        return (
            f"agent-limit: at most {bounds} (child agents below this harness count too); "
            "a refused child answers AGENT_STOPPED"
        )
    if isinstance(plugin, Approval):
        which = f"tools matching {', '.join(plugin.require)}" if plugin.require else ""
        asks = " and ".join(
            part
            for part in (which, "tools annotated destructive" if plugin.destructive else "")
            if part
        )
        limit = f" up to {plugin.timeout_ms} ms, then {plugin.on_timeout}s" * bool(
            plugin.timeout_ms
        )
        how = (
            f"waits for its approver{limit}"
            if plugin.approver is not None
            else "pauses the turn (reason approval) until agent.resume(decisions=...)"
        )
        return (
            f"approval: asks a person about {asks or 'calls other layers Ask about'}, and "
            f"{how}; pre-execute layers registered before it decide first"
        )
    if isinstance(plugin, BudgetNotice):
        return (
            f"budget-notice: before each model call, tells the model what is left of "
            f"{', '.join(plugin.show)} (of the caps that apply, its ancestors' included)"
        )
    return f"{getattr(plugin, 'name', type(plugin).__name__)}: (no explanation known)"


def _approval_warnings(plugins: list[object]) -> list[str]:
    """A cap or loop guard after Approval: a person is asked about calls it refuses."""
    at = next((i for i, p in enumerate(plugins) if isinstance(p, Approval)), None)
    if at is None:
        return []
    refusers = (ToolCallLimit, LoopDetector, AgentLimit)
    late = [getattr(p, "name", "?") for p in plugins[at + 1 :] if isinstance(p, refusers)]
    if not late:
        return []
    return [
        f"{', '.join(late)} registered after approval: a person is asked about calls "
        f"{'it' if len(late) == 1 else 'they'} may then refuse; register "
        f"{'it' if len(late) == 1 else 'them'} before approval so they deny first"
    ]


def _tree_warnings(harness: Harness, plugins: list[object]) -> list[str]:
    """Agent tools start child agents: is the tree bounded in depth and in time?"""
    names = sorted(
        name
        for name in (schema["function"]["name"] for schema in harness.tools.schemas())
        if (tool := harness.tools.get(name)) is not None and is_agent_tool(tool)
    )
    if not names:
        return []
    found: list[str] = []
    limits = [p for p in plugins if isinstance(p, AgentLimit)]
    if not any(p.max_depth is not None or p.max_agents is not None for p in limits):
        found.append(
            f"agent tools ({', '.join(names)}) start child agents but no agent-limit bounds "
            "the tree (max_depth or max_agents): a child that delegates again can recurse"
        )
    timed = any(isinstance(p, TurnDeadline) for p in plugins)
    if not timed and any(harness.tools.get(name).timeout_ms is None for name in names):  # type: ignore[union-attr]
        found.append(
            f"agent tools ({', '.join(names)}) have no deadline: add turn-deadline (the "
            "children inherit it) or give each a timeout_ms, or a stalled child hangs the turn"
        )
    return found


def _line_order(fair: object) -> str:
    """How a limiter's waiting calls are served."""
    if fair is None:
        return "; waiters by priority, then first come first served"
    return "; waiters by priority, then tenants in weighted turns (fair)"


def _stream_bounds(plugin: Timeout, stage: str) -> str:
    """What a timeout's first-byte and idle bounds add to its explanation."""
    piece = "chunk" if stage == "model" else "progress report"
    parts = []
    if plugin.first_byte_ms is not None:
        first = "the first byte" if stage == "model" else "the first progress report"
        parts.append(f"{first} within {plugin.first_byte_ms} ms")
    if plugin.idle_ms is not None:
        parts.append(f"no gap over {plugin.idle_ms} ms between one {piece} and the next")
    tail = (
        "; a tool that reports progress outlives its declared budget"
        if stage != "model" and plugin.ms is None and plugin.idle_ms is not None
        else ""
    )
    return f" (and {' and '.join(parts)}{tail})"


def _those_set(template: str, **values: int | None) -> str:
    """``template`` filled with each name and value that is set, comma-separated."""
    return ", ".join(
        template.format(name, value) for name, value in values.items() if value is not None
    )


def _explain_resilience(plugin: object, inside: bool, outside: bool, what: str) -> str | None:
    if isinstance(plugin, CircuitBreaker):
        counts = "attempts (it is inside the retry)" if inside else "operations"
        return (
            f"circuit-breaker: counts {counts}; opens at {plugin.failure_ratio:g} failures of "
            f"{plugin.minimum_calls}+ calls in {plugin.window_s:g}s, then answers at once for "
            f"{plugin.break_s:g}s"
        )
    if isinstance(plugin, AdaptiveConcurrencyLimit):
        held = "it limits attempts" if inside else "it limits operations"
        waits = "callers wait without bound" if plugin.queue is None else f"{plugin.queue} queued"
        return (
            f"adaptive-concurrency-limit: {plugin.algorithm}, from {plugin.initial} within "
            f"[{plugin.min}, {plugin.max}]; falls on rate limits, overloads and timeouts and "
            f"pauses for a Retry-After; {held}; {waits}" + _line_order(plugin.fair)
        )
    if isinstance(plugin, ConcurrencyLimit):
        held = "each attempt queues for a slot" if inside else "one slot per operation"
        return (
            f"concurrency-limit: {plugin.max_concurrent} at once, {plugin.queue} queued; "
            f"{held}; queue time counts against timeouts outside it, not inside"
            + _line_order(plugin.fair)
        )
    if isinstance(plugin, RateLimit):
        paid = "every attempt takes a token" if inside else "one token per operation"
        how = "waits for a token" if plugin.wait else "answers TOOL_RATE_LIMITED at once"
        line = f"rate-limit: {plugin.per_second:g}/s, burst {plugin.burst}; {paid}; {how}"
        return line + _line_order(plugin.fair)
    if isinstance(plugin, TokenRateLimit):
        limits = _those_set(
            "{1} {0}",
            tokens=plugin.tokens_per_minute,
            requests=plugin.requests_per_minute,
        )
        paid = "every attempt reserves" if inside else "one reservation per operation"
        how = "waits for room" if plugin.wait else "answers RATE_LIMITED with when to come back"
        return (
            f"token-rate-limit: at most {limits} in any sliding minute, each request's "
            f"estimate reserved before it is sent and its usage settled after; {paid}; {how}"
            + _line_order(plugin.fair)
        )
    if isinstance(plugin, Fallback):
        when = "after each failed attempt" if inside else "once, after every attempt failed"
        return f"fallback: answers with {plugin!r} {when}"
    if isinstance(plugin, Hedge):
        scope = "each attempt is hedged" if inside else "the whole operation is hedged"
        return (
            f"hedge: another attempt after {plugin.delay_ms} ms without an answer (up to "
            f"{plugin.max_hedges}); {scope}; never for tools declared idempotent=False"
        )
    if isinstance(plugin, Chaos):
        return f"chaos: injects {plugin.fault} into {what} at rate {plugin.rate:g}"
    return None


def _budget_warnings(plugins: list[object], budgets: dict[str, int]) -> list[str]:
    applies_budget = any(
        isinstance(p, ToolCallTimeoutPolicy) or (isinstance(p, Timeout) and p.ms is None)
        for p in plugins
        if _stage(p) == "dispatch"
    )
    if budgets and not applies_budget:
        names = ", ".join(sorted(budgets))
        return [
            f"tools declare budgets ({names}) but no timeout layer applies them: add "
            "tool-call-timeout-policy (or timeout with no ms); today they have no timeout at all"
        ]
    return []


def _retry_warnings(plugins: list[object], budgets: dict[str, int]) -> list[str]:
    warnings: list[str] = []
    dispatch = [p for p in plugins if _stage(p) == "dispatch" and not isinstance(p, Tracing)]
    retry_at = next((i for i, p in enumerate(dispatch) if isinstance(p, Retry)), None)
    if retry_at is None:
        return warnings
    retry = dispatch[retry_at]
    assert isinstance(retry, Retry)
    outer, inner = dispatch[:retry_at], dispatch[retry_at + 1 :]
    produced = set(_REGISTRY_CODES)
    produced |= {p.code for p in dispatch if isinstance(p, Timeout)}
    produced |= {
        code
        for p in dispatch
        for kind, code in (
            (CircuitBreaker, TOOL_UNAVAILABLE),
            (ConcurrencyLimit, TOOL_OVERLOADED),
            (AdaptiveConcurrencyLimit, TOOL_OVERLOADED),
            (RateLimit, TOOL_RATE_LIMITED),
            (TokenRateLimit, TOOL_RATE_LIMITED),
        )
        if isinstance(p, kind)
    }
    produced |= {
        p.fault.split(":", 1)[1]
        for p in dispatch
        if isinstance(p, Chaos) and ":" in p.fault and p.fault.startswith("fail:")
    }
    if any(isinstance(p, ToolCallTimeoutPolicy) for p in dispatch):
        produced.add(TOOL_TIMEOUT)
    if any(isinstance(p, ToolCallLimit) for p in plugins):
        produced.add(TOOL_DENIED)
    if not callable(retry.retry_on):
        unknown = sorted(set(retry.retry_on) - produced)
        if unknown:
            warnings.append(
                f"retry waits for {', '.join(unknown)}, which no layer in this stack produces "
                f"(misspelt?); known here: {', '.join(sorted(produced))}"
            )
    budget_outside = [p for p in outer if _timeout_on_tools(p) and getattr(p, "ms", None) is None]
    retries_timeouts = callable(retry.retry_on) or TOOL_TIMEOUT in retry.retry_on
    if budget_outside and retries_timeouts:
        warnings.append(
            "the tools' own budgets are applied outside the retry, which retries "
            "TOOL_TIMEOUT: a timed-out call is the whole operation's end, so the retry can "
            "never retry that timeout; apply the budget after the retry (per attempt), or give "
            "the outer timeout a total with ms"
        )
    per_attempt = [p for p in inner if _timeout_on_tools(p)]
    if budgets and not per_attempt:
        warnings.append(
            "retry has no per-attempt timeout inside it: a hung attempt uses up the whole "
            "operation; register a timeout (or the policy) after the retry"
        )
    outer_budgets = [p.ms for p in outer if isinstance(p, Timeout) and p.ms is not None]
    for outer_ms in outer_budgets:
        attempt_budgets = [p.ms for p in per_attempt if isinstance(p, Timeout) and p.ms]
        if any(
            isinstance(p, ToolCallTimeoutPolicy) or (isinstance(p, Timeout) and p.ms is None)
            for p in per_attempt
        ):
            attempt_budgets += list(budgets.values())
        if attempt_budgets and outer_ms <= min(attempt_budgets):
            warnings.append(
                f"the whole-operation timeout ({outer_ms} ms, outside the retry) is no "
                f"longer than one attempt's budget ({min(attempt_budgets)} ms): a hung attempt "
                "uses it all and the retry never runs"
            )
    if any(isinstance(p, CircuitBreaker) for p in inner):
        warnings.append(
            "the circuit breaker inside the retry counts attempts: one failing operation counts "
            f"up to {retry.attempts} times and opens it that much sooner; register it before "
            "the retry to count operations"
        )
    if any(isinstance(p, Metrics) for p in inner):
        warnings.append(
            "metrics inside the retry count attempts, not operations; register them before the "
            "retry to count each call once"
        )
    return warnings


@attrs.frozen
class TenantsReport:
    """A tenants file's tree and the warnings about it."""

    tree: str
    warnings: tuple[str, ...]

    def render(self) -> str:
        text = [self.tree, *(f"warning: {warning}" for warning in self.warnings)]
        return "\n".join(text)


def check_routes(upstreams: list[str], routes: list[str]) -> list[str]:
    """Where the model proxy would send each request (``--upstream``, ``--route``): one
    line per route, then what the rest does; a route to an upstream nobody named
    raises, with a "did you mean"."""
    from guardstack.cli.model_proxy import named_options
    from guardstack.gateway.model_proxy.routes import Router, read_route
    from guardstack.gateway.model_proxy.upstream import DEFAULT

    urls = named_options(upstreams, "--upstream", default_required=not routes)
    router = Router([read_route(route) for route in routes], urls,
                    DEFAULT if DEFAULT in urls else None)  # fmt: skip
    return ["routes:", *(f"  {line}" for line in router.describe(urls))]


def check_tenants(path: Path) -> TenantsReport:
    """A tenants file read (a mistake raises, one line) and shown as a tree; warnings for
    a dollar budget with no prices, and allowed models without one."""
    from guardstack.gateway.tenants import read_tenants

    tenants = read_tenants(path)
    warnings: list[str] = []
    budgets = [tenant.budget for tenant in tenants.tenants.values()]
    budgets += [team.budget for t in tenants.tenants.values() for team in t.teams.values()]
    budgets += [entry.budget for entry in tenants.keys.values() if entry.budget is not None]
    budgets += [tenants.key_default, tenants.conversation_default]
    dollars = any(name.startswith("usd") for budget in budgets for name in budget.limits)
    if dollars and not tenants.prices:
        from guardstack.gateway.prices import maintained_price

        if maintained_price("gpt-4o", "openai") is None:  # no maintained table either
            warnings.append(
                "a budget counts dollars but the file gives no prices and genai-prices is "
                "not installed: every request would be priced at $0; add prices"
            )
    from guardstack.gateway.prices import maintained_price

    for tenant in tenants.tenants.values():
        listed = set(tenant.models or ()) | {
            model for team in tenant.teams.values() for model in team.models or ()
        }
        for model in sorted(listed - set(tenants.prices or {})):
            if "*" in model or "?" in model or maintained_price(model) is not None:
                continue  # a glob prices nothing itself; the maintained table prices it
            warnings.append(
                f"tenant {tenant.name!r} may use {model!r}, which neither the file nor "
                "genai-prices prices: charged at the highest price in the file"
            )
    return TenantsReport(tenants.describe(), tuple(warnings))
