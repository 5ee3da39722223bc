"""Loops that do not repeat exactly, and their look-alikes: the tuning and validation sets.

    python -m benchmarks.loops.corpus      # writes every set (shipped, tuning, validation)

Each shape is written once and drawn in two *vocabularies*: the tuning set uses one
(its tool names, argument keys, result texts, volatile fields), the validation set
the other, with another seed. Defaults are chosen on the tuning set only; the
validation set checks that they hold on tools, keys and texts the tuning never saw.

Loops (label: the index of the first wasted call):

* ``volatile_timestamp`` — the same call with a fresh timestamp argument each time;
* ``volatile_request_id`` — the same call with a fresh random request id;
* ``attempt_counter`` — an attempt counter that goes 1, 2, 3 with the same error;
* ``case_whitespace`` — a query retyped in another case or spacing, same results;
* ``paging_past_end`` — the page (or offset) keeps rising while every result is empty;
* ``edit_test_timing`` — edit and test again, the output differing only in a timing;
* ``poll_timestamp`` — a poll whose pending status changes only in its timestamp;
* ``cycle_with_bookkeeping`` — a two-call cycle with a planning call in every round;
* ``identical_with_bookkeeping`` — one call repeated with a to-do update between;
* ``long_cycle`` — a cycle of four or five calls.

Legitimate repetition (label: none):

* ``poll_advancing`` — a poll whose status advances (10 %, 20 %…), then done;
* ``poll_until_done`` — the same pending status up to 8 times, then done;
* ``batch_applied`` — one tool over 30–100 distinct items, each answering the same;
* ``pagination_with_results`` — pages (or offsets) that each return results;
* ``refined_query`` — a query refined each time until it finds something;
* ``retry_then_success`` — an attempt counter with the same error twice, then success;
* ``test_fix_progress`` — edit and test, fewer failures each round (timings vary);
* ``work_with_bookkeeping`` — different reads with a plan update between them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import attrs

Step = tuple[str, dict[str, Any], str, bool]  # tool, arguments, result, failed


@attrs.frozen
class Vocabulary:
    """The names one set's sessions use: every shape draws its tools and keys from here."""

    name: str
    fetch: str
    time_key: str
    epoch: bool
    create: str
    id_key: str
    action: str
    counter_key: str
    failure: str
    search: str
    query_key: str
    query: str
    lister: str
    page_key: str
    page_step: int
    empty: str
    edit: str
    test: str
    timing: str
    status: str
    status_key: str
    pending: str
    plan: str
    plan_ack: str
    reader: str
    cycle_tools: tuple[str, ...]
    batch: str
    batch_ack: str


TUNING = Vocabulary(
    name="tuning",
    fetch="fetch_metrics",
    time_key="ts",
    epoch=False,
    create="create_ticket",
    id_key="request_id",
    action="deploy",
    counter_key="attempt",
    failure="deploy failed: quota exceeded",
    search="search",
    query_key="query",
    query="install guide",
    lister="list_issues",
    page_key="page",
    page_step=1,
    empty="[]",
    edit="edit",
    test="run_tests",
    timing="{n} failed in {t:.2f}s",
    status="job_status",
    status_key="id",
    pending="queued (checked at {clock})",
    plan="update_plan",
    plan_ack="plan updated",
    reader="read_file",
    cycle_tools=("ls", "cat", "grep", "edit"),
    batch="apply_patch",
    batch_ack="applied",
)

VALIDATION = Vocabulary(
    name="validation",
    fetch="get_weather",
    time_key="timestamp",
    epoch=True,
    create="send_query",
    id_key="requestId",
    action="upload",
    counter_key="retry",
    failure="upload failed: HTTP 413",
    search="lookup",
    query_key="q",
    query="python  asyncio docs",
    lister="search_logs",
    page_key="offset",
    page_step=50,
    empty="No results found.",
    edit="str_replace",
    test="pytest",
    timing="FAILED tests/test_io.py::test_read - {n} failed, 3 passed in {t:.1f}s",
    status="check_build",
    status_key="build",
    pending="status=pending at {iso}",
    plan="todo_write",
    plan_ack="Todos updated.",
    reader="view",
    cycle_tools=("open_page", "scroll", "find", "click", "back"),
    batch="tag_image",
    batch_ack="ok",
)


def _clock(rng: random.Random, n: int) -> str:
    return f"12:{n // 60:02d}:{n % 60:02d}.{rng.randint(0, 999):03d}"


def _iso(n: int) -> str:
    return f"2026-11-30T09:{n // 60:02d}:{n % 60:02d}Z"


def _casing(rng: random.Random, text: str) -> str:
    casings: list[Callable[[str], str]] = [str.upper, str.lower, str.title, str.strip]
    variant = rng.choice(casings)(text)
    return (" " * rng.randint(0, 2)) + variant.replace(" ", " " * rng.randint(1, 3))


def loops(vocab: Vocabulary, rng: random.Random) -> dict[str, Callable[[], tuple[list[Step], int]]]:
    """Each loop shape: its steps and the index (within them) of the first wasted call."""
    v = vocab

    def volatile_timestamp() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for n in range(rng.randint(5, 14)):
            stamp: Any = 1_764_000_000 + n * rng.randint(2, 30) if v.epoch else _iso(n * 7)
            steps.append((v.fetch, {"city": "Oslo", v.time_key: stamp}, "no data for Oslo", False))
        return steps, 1

    def volatile_request_id() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for _ in range(rng.randint(4, 12)):
            arguments = {"title": "Login fails", v.id_key: str(uuid.UUID(int=rng.getrandbits(128)))}
            steps.append((v.create, arguments, "error: a ticket with this title exists", True))
        return steps, 1

    def attempt_counter() -> tuple[list[Step], int]:
        count = rng.randint(4, 12)
        arguments = {"target": "prod"}
        steps = [
            (v.action, {**arguments, v.counter_key: n}, v.failure, True) for n in range(1, count)
        ]
        return steps, 1

    def case_whitespace() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for _ in range(rng.randint(5, 12)):
            arguments = {v.query_key: _casing(rng, v.query)}
            steps.append((v.search, arguments, "2 results: setup.md, faq.md", False))
        return steps, 1

    def paging_past_end() -> tuple[list[Step], int]:
        full = rng.randint(1, 4)
        steps: list[Step] = [
            (v.lister, {v.page_key: n * v.page_step}, f"{20} entries from {n * 20}", False)
            for n in range(1, full + 1)
        ]
        for n in range(full + 1, full + 1 + rng.randint(5, 12)):
            steps.append((v.lister, {v.page_key: n * v.page_step}, v.empty, False))
        return steps, full + 1  # the first empty page is news; the next is wasted

    def edit_test_timing() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for _ in range(rng.randint(3, 8)):
            steps.append(
                (v.edit, {"path": "io.py", "old": "x", "new": "y"}, "no match for 'x'", False)
            )
            steps.append((v.test, {}, v.timing.format(n=1, t=rng.uniform(0.3, 2.0)), False))
        return steps, 2

    def poll_timestamp() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for n in range(rng.randint(14, 25)):
            text = v.pending.format(clock=_clock(rng, n * 5), iso=_iso(n * 5))
            steps.append((v.status, {v.status_key: 9}, text, False))
        return steps, 1

    def cycle_with_bookkeeping() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for n in range(rng.randint(4, 9)):
            steps.append((v.reader, {"path": "api.py"}, "def handler(): ...", False))
            steps.append((v.test, {"k": "api"}, "1 failed: test_handler", False))
            steps.append((v.plan, {"plan": f"step {n}: retry the handler"}, v.plan_ack, False))
        return steps, 3

    def identical_with_bookkeeping() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for n in range(rng.randint(6, 12)):
            steps.append((v.reader, {"path": "db.py"}, "class DB: ...", False))
            steps.append((v.plan, {"item": f"check db {n}"}, v.plan_ack, False))
        return steps, 2

    def long_cycle() -> tuple[list[Step], int]:
        tools = v.cycle_tools
        unit: list[Step] = [
            (tool, {"where": "settings"}, f"{tool}: same as before", False) for tool in tools
        ]
        return [step for _ in range(rng.randint(3, 5)) for step in unit], len(unit)

    return {
        "volatile_timestamp": volatile_timestamp,
        "volatile_request_id": volatile_request_id,
        "attempt_counter": attempt_counter,
        "case_whitespace": case_whitespace,
        "paging_past_end": paging_past_end,
        "edit_test_timing": edit_test_timing,
        "poll_timestamp": poll_timestamp,
        "cycle_with_bookkeeping": cycle_with_bookkeeping,
        "identical_with_bookkeeping": identical_with_bookkeeping,
        "long_cycle": long_cycle,
    }


def look_alikes(vocab: Vocabulary, rng: random.Random) -> dict[str, Callable[[], list[Step]]]:
    """Each legitimate shape that looks like a loop and is not one."""
    v = vocab

    def poll_advancing() -> list[Step]:
        count = rng.randint(8, 20)
        steps: list[Step] = [
            (v.status, {v.status_key: 5}, f"running: {round(100 * n / count)}% done", False)
            for n in range(count)
        ]
        return [*steps, (v.status, {v.status_key: 5}, "done", False)]

    def poll_until_done() -> list[Step]:
        waiting = rng.randint(1, 8)
        steps: list[Step] = [
            (v.status, {v.status_key: 6}, v.pending.format(clock="", iso="").strip(), False)
            for _ in range(waiting)
        ]
        return [*steps, (v.status, {v.status_key: 6}, "finished", False)]

    def batch_applied() -> list[Step]:
        return [
            (v.batch, {"path": f"src/module_{n}.py", "patch": "-old +new"}, v.batch_ack, False)
            for n in range(rng.randint(30, 100))
        ]

    def pagination_with_results() -> list[Step]:
        return [
            (v.lister, {v.page_key: n * v.page_step}, f"entries {n * 20}-{n * 20 + 19}: ...", False)
            for n in range(1, rng.randint(6, 20))
        ]

    def refined_query() -> list[Step]:
        words = ["timeout", "timeout error", "timeout error asyncio", "asyncio wait_for timeout"]
        steps: list[Step] = [
            (v.search, {v.query_key: query}, v.empty, False) for query in words[: rng.randint(2, 4)]
        ]
        return [
            *steps,
            (v.search, {v.query_key: "anyio fail_after"}, "1 result: timeouts.md", False),
        ]

    def retry_then_success() -> list[Step]:
        return [
            (v.action, {"target": "prod", v.counter_key: 1}, v.failure, True),
            (v.action, {"target": "prod", v.counter_key: 2}, v.failure, True),
            (v.action, {"target": "prod", v.counter_key: 3}, "deployed", False),
        ]

    def test_fix_progress() -> list[Step]:
        rounds = rng.randint(3, 8)
        steps: list[Step] = []
        for n in range(rounds):
            steps.append((v.edit, {"path": "io.py", "old": f"bug{n}", "new": "fix"}, "ok", False))
            failures = rounds - n - 1
            steps.append((v.test, {}, v.timing.format(n=failures, t=rng.uniform(0.3, 2.0)), False))
        return steps

    def work_with_bookkeeping() -> list[Step]:
        steps: list[Step] = []
        for n in range(rng.randint(4, 10)):
            steps.append((v.reader, {"path": f"pkg/part{n}.py"}, f"part {n}: ...", False))
            steps.append((v.plan, {"item": f"read part {n}"}, v.plan_ack, False))
        return steps

    return {
        "poll_advancing": poll_advancing,
        "poll_until_done": poll_until_done,
        "batch_applied": batch_applied,
        "pagination_with_results": pagination_with_results,
        "refined_query": refined_query,
        "retry_then_success": retry_then_success,
        "test_fix_progress": test_fix_progress,
        "work_with_bookkeeping": work_with_bookkeeping,
    }
