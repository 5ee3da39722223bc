"""A random script of a state store's operations, played on any store: two stores that
implement the seam alike give the same answers (time-independent: one window, long
breaks)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from guardstack.pipeline.contract import StateStore

operations = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from("ab"), st.integers(1, 3)),
        st.tuples(st.just("release"), st.sampled_from("ab"), st.integers(0, 5)),
        st.tuples(st.just("add"), st.sampled_from("xy"), st.integers(-3, 5)),
        st.tuples(st.just("record"), st.sampled_from("pq"), st.booleans()),
        st.tuples(st.just("admit"), st.sampled_from("pq"), st.just(0)),
    ),
    max_size=25,
)


async def play(store: StateStore, script: list[tuple[str, str, Any]]) -> list[Any]:
    """Each operation's answer, in order: slots taken and released, counters added to,
    breakers recorded and asked."""
    answers: list[Any] = []
    leases: dict[str, list[str]] = {}
    for operation, key, value in script:
        if operation == "acquire":
            lease = await store.acquire(key, value)
            if lease is not None:
                leases.setdefault(key, []).append(lease)
            answers.append(lease is not None)
        elif operation == "release":
            held = leases.get(key, [])
            if held:
                await store.release_slot(key, held.pop(value % len(held)))
            answers.append(len(held))
        elif operation == "add":
            answers.append(await store.add(key, value, limit=6))
        elif operation == "record":
            answers.append(
                await store.record(key, value, False, window_s=60, minimum_calls=3,
                                   failure_ratio=0.5)
            )  # fmt: skip
        else:
            answers.append((await store.admit(key, 60)).admitted)
    return answers
