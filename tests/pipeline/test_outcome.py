"""The outcome core: what both stages' calls share each call answers itself (``CallContext``);
the stage adapters answer only how an outcome fails."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.pipeline import Agent, Harness, ModelRequest, ScriptedModel, ToolCall
from guardstack.pipeline.call_context import CallContext
from guardstack.pipeline.contract import DISPATCH, MODEL, StageAdapter


def an_agent() -> Agent:
    return Harness(ScriptedModel([])).loop.create("s", tenant="team-a", priority=3)


def stage_and_item(stage: str) -> tuple[StageAdapter[Any, Any, Any], CallContext]:
    agent = an_agent()
    if stage == "model":
        return MODEL, ModelRequest(agent, [], [])
    return DISPATCH, ToolCall("search", {}, "c1", agent)


@pytest.mark.parametrize("stage", ["dispatch", "model"])
def test_a_call_without_its_own_tenant_or_priority_takes_its_agents(stage: str) -> None:
    _, item = stage_and_item(stage)
    assert (item.owner, item.queue_priority) == ("team-a", 3)


def test_a_calls_own_tenant_and_priority_come_before_its_agents() -> None:
    agent = an_agent()
    assert ToolCall("x", {}, "c", agent, tenant="team-b").owner == "team-b"
    assert ModelRequest(agent, [], []).owner == "team-a"  # its agent's, always
    assert ModelRequest(agent, [], [], priority=9).queue_priority == 9
    assert ToolCall("x", {}, "c", agent, priority=0).queue_priority == 0


def test_a_call_of_no_agent_is_the_default_tenants_at_priority_zero() -> None:
    call = ToolCall("x", {}, "c")
    assert (call.owner, call.queue_priority) == ("default", 0)


@pytest.mark.parametrize("stage", ["dispatch", "model"])
def test_attempt_and_hedge_change_only_a_copy_and_only_when_they_differ(stage: str) -> None:
    _, item = stage_and_item(stage)
    assert item.with_attempt(1) is item
    second = item.with_attempt(2)
    assert (second.attempt, item.attempt) == (2, 1)
    hedged = second.with_hedge(1)
    assert (hedged.hedge, hedged.attempt) == (1, 2)
    assert hedged.with_hedge(1) is hedged


# -- a note is added to an outcome, never a new outcome made that forgets ---------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from guardstack.pipeline import ModelError, ModelReply, ToolError, ToolResult  # noqa: E402

_codes = st.sampled_from(["MODEL_RATE_LIMITED", "MODEL_UNAVAILABLE", "MODEL_FAILED", "X"])
_waits = st.none() | st.floats(0, 1e6, allow_nan=False)


@given(
    message=st.text(max_size=40),
    code=_codes,
    retry_after_s=_waits,
    layer=st.none() | st.sampled_from(["rate-limit", "circuit-breaker"]),
    refused=st.booleans(),
    partial=st.none() | st.text(max_size=20),
    note=st.text(min_size=1, max_size=40),
)
def test_a_model_failure_explained_keeps_all_it_carried(
    message: str,
    code: str,
    retry_after_s: float | None,
    layer: str | None,
    refused: bool,
    partial: str | None,
    note: str,
) -> None:
    failure = ModelError(
        message, code, retry_after_s, layer=layer, refused=refused, partial=partial
    )
    explained = MODEL.explained(failure, note)
    assert isinstance(explained, ModelError)
    assert (explained.code, explained.retry_after_s, explained.layer) == (
        code,
        retry_after_s,
        layer,
    )
    assert (explained.refused, explained.partial) == (refused, partial)
    assert explained.message == f"{message} ({note})"
    assert str(explained) == f"{code}: {message} ({note})"  # the code once
    assert explained.__cause__ is failure


@given(
    content=st.text(max_size=40),
    code=st.none() | st.sampled_from(["TOOL_RATE_LIMITED", "TOOL_TIMEOUT"]),
    retry_after_s=_waits,
    note=st.text(min_size=1, max_size=40),
)
def test_a_tool_failure_explained_keeps_all_it_carried(
    content: str, code: str | None, retry_after_s: float | None, note: str
) -> None:
    value = object()
    failure = ToolResult(
        content, True, ToolError(content, "Busy", code, retry_after_s=retry_after_s), value
    )
    explained = DISPATCH.explained(failure, note)
    assert explained.error is not None
    assert (explained.code, explained.error.retry_after_s, explained.error.name) == (
        code,
        retry_after_s,
        "Busy",
    )
    assert explained.value is value
    assert explained.content == f"{content} ({note})"
    assert explained.error.message == f"{content} ({note})"


def test_a_subclass_that_cannot_be_copied_is_explained_with_its_fields() -> None:
    class Strict(ModelError):
        def __init__(self, message: str, extra: int) -> None:
            super().__init__(message, "MODEL_RATE_LIMITED", 3.0, refused=True)

    explained = MODEL.explained(Strict("busy", 1), "not retried")
    assert isinstance(explained, ModelError)
    assert (explained.refused, explained.retry_after_s) == (True, 3.0)


# -- what differs between the stages, and only that ---------------------------------------


def test_the_stage_adapter_keeps_at_most_ten_members() -> None:
    members = {name for name in vars(StageAdapter) if not name.startswith("_")}
    members |= set(StageAdapter.__annotations__)
    assert len(members) <= 10, sorted(members)


@pytest.mark.parametrize("stage", ["dispatch", "model"])
@given(
    kind=st.sampled_from(["UNAVAILABLE", "OVERLOADED", "RATE_LIMITED", "TIMEOUT", "FAILED"]),
    retry_after_s=_waits,
)
def test_a_refusal_reads_back_the_same_on_both_stages(
    stage: str, kind: Any, retry_after_s: float | None
) -> None:
    from guardstack.pipeline.outcome import Failed, refusal

    adapter, item = stage_and_item(stage)
    made = refusal(adapter, item, kind, "full", layer="rate-limit", name="Full",
                   retry_after_s=retry_after_s)  # fmt: skip
    code = adapter.code_for(kind)
    assert adapter.failure_of(made) == Failed(code, True, True, retry_after_s)
    provider = adapter.failure(item, code, "busy", retry_after_s=retry_after_s)
    assert adapter.failure_of(provider) == Failed(code, False, False, retry_after_s)


@pytest.mark.parametrize("stage", ["dispatch", "model"])
def test_a_success_has_no_failure_and_a_timeout_names_its_stage(stage: str) -> None:
    from guardstack.pipeline.outcome import timed_out

    adapter, item = stage_and_item(stage)
    success = ModelReply("ok") if stage == "model" else ToolResult("ok")
    assert adapter.failure_of(success) is None
    late = timed_out(adapter, item, 250, adapter.code_for("TIMEOUT"), "timeout")
    noun = "model" if stage == "model" else "tool"
    failed = adapter.failure_of(late)
    assert failed is not None
    assert failed.code == adapter.code_for("TIMEOUT")
    assert not failed.control
    assert f"{noun} call timed out after 250ms" in str(late if stage == "model" else late.content)


# -- every layer passes an outcome on: a refusal keeps what it carries, whatever the stack --

from guardstack.pipeline.outcome import Failed, Refusal, refusal  # noqa: E402
from guardstack.pipeline.testing import ScriptedTool  # noqa: E402
from guardstack.wrappers import (  # noqa: E402
    AdaptiveConcurrencyLimit,
    CircuitBreaker,
    ConcurrencyLimit,
    Hedge,
    Metrics,
    RateLimit,
    Retry,
    Timeout,
    Tracing,
)
from tests.helpers import call  # noqa: E402

_KINDS: Any = ("UNAVAILABLE", "OVERLOADED", "RATE_LIMITED")


def _refused_codes(stage: str) -> list[str]:
    adapter = MODEL if stage == "model" else DISPATCH
    return [adapter.code_for(kind) for kind in _KINDS]


#: Every layer that serves both stages, built for one: each must hand a refusal on as
#: it came, a note at most added to its message.
LAYERS: dict[str, Any] = {
    "retry": lambda stage: Retry(
        attempts=3,
        retry_on=_refused_codes(stage),
        backoff_ms=1,
        jitter=False,
        respect_deadline=True,
        stage=stage,
    ),
    "breaker": lambda stage: CircuitBreaker(minimum_calls=1, stage=stage),
    "concurrency": lambda stage: ConcurrencyLimit(4, stage=stage),
    "adaptive": lambda stage: AdaptiveConcurrencyLimit(stage=stage),
    "rate": lambda stage: RateLimit(1000, burst=10, stage=stage),
    "deadline": lambda stage: Timeout(ms=15_000, stage=stage),
    "hedge": lambda stage: Hedge(delay_ms=1, stage=stage),
    "metrics": lambda stage: Metrics(stage=stage),
    "tracing": lambda stage: Tracing(),
}

_stacks = st.lists(st.sampled_from(sorted(LAYERS)), unique=True, max_size=len(LAYERS))


@pytest.mark.parametrize("stage", ["dispatch", "model"])
@given(
    stack=_stacks,
    kind=st.sampled_from(_KINDS),
    retry_after_s=st.none() | st.integers(0, 60).map(float),
    partial=st.none() | st.text(min_size=1, max_size=20),
)
async def test_every_layer_passes_a_refusal_on_with_all_it_carries(
    stage: str, stack: list[str], kind: Any, retry_after_s: float | None, partial: str | None
) -> None:
    """Defect 7 as a class: a layer that stops early (a ``Retry`` near its deadline) or
    times, counts, traces or hedges a call adds a note at most; it never makes a new
    outcome that forgets ``refused``, ``retry_after_s``, the refusing layer or the
    partial reply."""
    harness = Harness(ScriptedModel([]))
    ScriptedTool("t", ["ok"] * 10).register(harness.tools)
    for name in stack:
        harness.plugin(LAYERS[name](stage))
    adapter: StageAdapter[Any, Any, Any] = MODEL if stage == "model" else DISPATCH
    code = adapter.code_for(kind)

    async def refuse(item: Any, call_next: Any) -> Any:
        made = adapter.failure(item, code, "the inner layer is full", name="Full",
                               layer="inner", refused=True, retry_after_s=retry_after_s,
                               partial=partial)  # fmt: skip
        return adapter.deliver(made)

    expected = Failed(code, True, True, retry_after_s)
    # A deadline (15 s) outside the retry stops it early when a second wait of the
    # refusal's own length (capped at Retry's 10 s) would not fit in what is left.
    stopped = (
        "deadline" in stack
        and "retry" in stack
        and stack.index("deadline") < stack.index("retry")
        and (retry_after_s or 0) >= 7.5
    )
    if stage == "dispatch":
        harness.tools.dispatch.use(refuse, name="inner")
        result = (await harness.tools.execute(call("t"))).result
        assert DISPATCH.failure_of(result) == expected
        assert result.value == Refusal("inner", retry_after_s)
        assert result.content.startswith("Error: the inner layer is full")
        assert ("(not retried:" in result.content) is stopped
        return
    harness.loop.model_call.use(refuse, name="inner")
    request = ModelRequest(harness.loop.create("s"), [], [])
    with pytest.raises(ModelError) as raised:
        await harness.loop.model_call.entry(request)
    assert MODEL.failure_of(raised.value) == expected
    assert (raised.value.layer, raised.value.partial) == ("inner", partial)
    assert raised.value.message.startswith("the inner layer is full")
    assert ("(not retried:" in raised.value.message) is stopped


def test_a_refusal_made_by_the_helper_is_what_a_layer_makes() -> None:
    agent = an_agent()
    made = refusal(MODEL, ModelRequest(agent, [], []), "OVERLOADED", "full",
                   layer="concurrency-limit", name="Full")  # fmt: skip
    assert isinstance(made, ModelError)
    assert (made.refused, made.layer, made.code) == (True, "concurrency-limit", "MODEL_OVERLOADED")
    assert not isinstance(made, ModelReply)


# -- 0.1's adapter members keep working, warning, until 0.3 -------------------------------


@pytest.mark.parametrize("stage", ["dispatch", "model"])
def test_the_old_adapter_members_warn_and_answer_as_before(stage: str) -> None:
    adapter, item = stage_and_item(stage)
    made = refusal(adapter, item, "RATE_LIMITED", "full", layer="rate-limit", name="Full",
                   retry_after_s=2.0)  # fmt: skip
    old: Any = adapter
    with pytest.warns(DeprecationWarning, match=r"StageAdapter\.failed .* failure_of"):
        assert old.failed(made) is True
    with pytest.warns(DeprecationWarning, match="goes in 0.3"):
        answers = (
            old.code(made), old.is_control(made), old.is_refusal(made), old.retry_after_s(made),
            old.key(item), old.label(item), old.budget_ms(item), old.may_repeat(item),
            old.name_of(item), old.tenant_of(item), old.priority_of(item),
            old.attempt_of(old.with_attempt(item, 2)), old.hedge_of(old.with_hedge(item, 1)),
            old.has_names, old.needs_budget,
        )  # fmt: skip
    assert answers == (
        adapter.code_for("RATE_LIMITED"), True, True, 2.0,
        item.key, item.label, item.budget_ms, item.may_repeat,
        item.tool_name, "team-a", 3, 2, 1,
        stage == "dispatch", stage == "model",
    )  # fmt: skip
    with pytest.warns(DeprecationWarning, match="goes in 0.3"):
        again = old.refusal(item, "RATE_LIMITED", "full", layer="rate-limit", name="Full",
                            retry_after_s=2.0)  # fmt: skip
    assert adapter.failure_of(again) == adapter.failure_of(made)
    with pytest.warns(DeprecationWarning, match="goes in 0.3"):
        late = old.timed_out(item, 100, adapter.code_for("TIMEOUT"), "timeout")
    assert adapter.failure_of(late) == Failed(adapter.code_for("TIMEOUT"))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        old.nonsense  # noqa: B018
    # 0.1's positional name still lands where it did
    named = adapter.failure(item, adapter.code_for("FAILED"), "broke", "ChaosFault")
    if stage == "dispatch":
        assert named.error.name == "ChaosFault"
