"""A fresh generalisation set, made after the defaults were chosen (2026-12-06): a third
vocabulary (tools, keys and texts neither earlier set uses) drawing every earlier
shape, and shapes of loops and of look-alikes that no earlier set has.

    python -m benchmarks.loops.fresh       # writes sessions-fresh/ and labels-fresh.json
    python -m benchmarks.loops --set fresh # scores it

New loop shapes (label: the first wasted call):

* ``alternating_arguments`` — one tool asked the same two things in turn, each answered
  as before (a ↔ b, as an agent toggling between two guesses);
* ``error_with_trace_id`` — the same failing call whose error differs only in a trace
  id and a time it carries;
* ``nested_cycle`` — a cycle of three calls, the same results each round, its calls'
  arguments carrying a fresh nonce;
* ``cursor_token`` — the same listing asked with a fresh opaque cursor each time,
  answering the same page.

New look-alikes (label: none):

* ``same_answer_many_files`` — many different files, each read answering "(empty)";
* ``retry_with_backoff_success`` — one call failing with a 503 three times, then working;
* ``monitoring_changes`` — a status checked again and again, its answer changing each
  time (a value, not a timestamp);
* ``search_then_read`` — search, read the hit, search again for something else.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.loops import shapes
from benchmarks.loops.corpus import Case, _prefix, set_paths, write_set

FRESH = shapes.Vocabulary(
    name="fresh",
    fetch="read_sensor",
    time_key="sampledAt",
    epoch=True,
    create="open_incident",
    id_key="traceparent",
    action="rollout",
    counter_key="try_number",
    failure="rollout blocked: canary unhealthy",
    search="find_symbol",
    query_key="symbol",
    query="Parse  Config",
    lister="list_buckets",
    page_key="start",
    page_step=25,
    empty="(no items)",
    edit="apply_diff",
    test="cargo_test",
    timing="test result: FAILED. {n} failed; 12 passed; finished in {t:.2f}s",
    status="get_pipeline",
    status_key="pipeline",
    pending="state: waiting (as of {iso})",
    plan="set_todos",
    plan_ack="saved",
    reader="cat_file",
    cycle_tools=("tab_open", "tab_read", "tab_close"),
    batch="label_ticket",
    batch_ack="labelled",
)
SEED = 20261206
PER_SHAPE = 8

Step = shapes.Step


def new_loops(rng: random.Random) -> dict[str, Callable[[], tuple[list[Step], int]]]:
    def alternating_arguments() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for _ in range(rng.randint(3, 7)):
            for guess in ("config.toml", "settings.toml"):
                steps.append(("locate", {"name": guess}, f"{guess}: not found", False))
        return steps, 2

    def error_with_trace_id() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for n in range(rng.randint(4, 10)):
            trace = uuid.UUID(int=rng.getrandbits(128)).hex
            text = f"503 upstream unavailable (trace {trace}) at 2026-12-06T10:{n:02d}:00Z"
            steps.append(("publish_report", {"report": "weekly"}, text, True))
        return steps, 1

    def nested_cycle() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for _ in range(rng.randint(3, 6)):
            nonce = uuid.UUID(int=rng.getrandbits(128)).hex[:12]
            steps += [
                ("tab_open", {"url": "https://status.example.org", "nonce": nonce},
                 "opened tab 2", False),
                ("tab_read", {"tab": 2}, "All systems operational.", False),
                ("tab_close", {"tab": 2}, "closed", False),
            ]  # fmt: skip
        return steps, 3

    def cursor_token() -> tuple[list[Step], int]:
        steps: list[Step] = []
        for _ in range(rng.randint(5, 12)):
            cursor = uuid.UUID(int=rng.getrandbits(128)).hex
            steps.append(("list_buckets", {"cursor": cursor}, "bucket-a, bucket-b", False))
        return steps, 1

    return {
        "alternating_arguments": alternating_arguments,
        "error_with_trace_id": error_with_trace_id,
        "nested_cycle": nested_cycle,
        "cursor_token": cursor_token,
    }


def new_look_alikes(rng: random.Random) -> dict[str, Callable[[], list[Step]]]:
    def same_answer_many_files() -> list[Step]:
        return [("cat_file", {"path": f"fixtures/empty_{n}.txt"}, "(empty)", False)
                for n in range(rng.randint(6, 20))]  # fmt: skip

    def retry_with_backoff_success() -> list[Step]:
        failing: list[Step] = [
            ("publish_report", {"report": "weekly"}, "503 upstream unavailable", True)
            for _ in range(3)
        ]
        return [*failing, ("publish_report", {"report": "weekly"}, "published", False)]

    def monitoring_changes() -> list[Step]:
        return [("get_queue_depth", {"queue": "jobs"}, f"depth: {rng.randint(0, 900)}", False)
                for _ in range(rng.randint(6, 16))]  # fmt: skip

    def search_then_read() -> list[Step]:
        steps: list[Step] = []
        for name in ("ParseConfig", "LoadConfig", "SaveConfig", "ConfigError")[: rng.randint(2, 4)]:
            steps.append(("find_symbol", {"symbol": name}, f"src/config.rs: fn {name}", False))
            steps.append(("cat_file", {"path": "src/config.rs"}, "fn ParseConfig() { ... }", False))
        return steps

    return {
        "same_answer_many_files": same_answer_many_files,
        "retry_with_backoff_success": retry_with_backoff_success,
        "monitoring_changes": monitoring_changes,
        "search_then_read": search_then_read,
    }


def fresh_cases(per_shape: int = PER_SHAPE) -> list[Case]:
    """The set: every earlier shape in the fresh vocabulary, and the new shapes."""
    rng = random.Random(SEED)
    made: list[Case] = []
    loops: dict[str, Any] = {**shapes.loops(FRESH, rng), **new_loops(rng)}
    for shape, make in loops.items():
        for n in range(per_shape):
            prefix = _prefix(rng)
            steps, wasted_after = make()
            made.append(
                Case(f"fresh-{shape}-{n:02d}", shape, (*prefix, *steps), len(prefix) + wasted_after)
            )
    alikes: dict[str, Any] = {**shapes.look_alikes(FRESH, rng), **new_look_alikes(rng)}
    for shape, legit in alikes.items():
        for n in range(per_shape):
            made.append(Case(f"fresh-{shape}-{n:02d}", shape, (*_prefix(rng), *legit()), None))
    return made


if __name__ == "__main__":
    write_set(fresh_cases(), *set_paths("fresh"))
