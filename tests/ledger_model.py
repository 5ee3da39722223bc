"""A reference model of the ``Ledger`` contract and a hypothesis state machine that holds
any store to it: random reservations, settlements, releases, closed windows, repeated
and late operations — and, where the store is remote, lost replies and restarts.

The machine drives the store the way the caps do (``guards/_accounts.py``): a
reservation whose answer was lost is released by its id (retried until the store
answers); a settlement or release whose answer was lost is sent again. The model then
says what every window must hold.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from guardstack.pipeline.contract import Ledger, Window, store_key
from guardstack.pipeline.store import StoreError

#: Windows the machine reserves in: two with limits (one a floor may raise), one without.
LIMITS: dict[str, tuple[str, float | None]] = {
    "calls": ("calls", 6.0),
    "usd": ("usd", 2.5),
    "tokens": ("tokens", None),
}
EPSILON = 1e-6


@attrs.define
class ModelOperation:
    state: str  # "reserved", "settled", "released"
    amounts: dict[str, float]  # window name -> amount reserved


@attrs.define
class LedgerModel:
    """What every window holds, by the contract."""

    values: dict[str, float] = attrs.Factory(lambda: dict.fromkeys(LIMITS, 0.0))
    operations: dict[str, ModelOperation] = attrs.Factory(dict)

    def reserve(
        self, op_id: str, amounts: dict[str, float], names: list[str], floors: dict[str, float]
    ) -> str | None:
        """The window that refuses, or ``None`` (reserved)."""
        raised = {name: max(self.values[name], floors.get(name, 0.0)) for name in names}
        for name in names:
            limit = LIMITS[name][1]
            amount = amounts.get(LIMITS[name][0], 0.0)
            if limit is not None and amount > 0 and raised[name] + amount > limit + 1e-9:
                return name
        for name in names:
            amount = amounts.get(LIMITS[name][0], 0.0)
            self.values[name] = raised[name] + amount
        self.operations[op_id] = ModelOperation(
            "reserved", {name: amounts.get(LIMITS[name][0], 0.0) for name in names}
        )
        return None

    def settle(self, op_id: str, actual: dict[str, float]) -> None:
        operation = self.operations.get(op_id)
        if operation is None or operation.state != "reserved":
            return
        for name, amount in operation.amounts.items():
            spent = actual.get(LIMITS[name][0], amount)
            self.values[name] = max(0.0, self.values[name] + spent - amount)
        operation.state = "settled"

    def release(self, op_id: str) -> None:
        operation = self.operations.get(op_id)
        if operation is None or operation.state != "reserved":
            return
        for name, amount in operation.amounts.items():
            self.values[name] = max(0.0, self.values[name] - amount)
        operation.state = "released"

    def answer(self, kind: str, op_id: str) -> str:
        """What a store answers to ``settle`` or ``release`` of ``op_id`` now (before it
        changes anything): every store alike, an ended operation included."""
        operation = self.operations.get(op_id)
        if operation is None:
            return "unknown"
        done = "settled" if kind == "settle" else "released"
        if operation.state == "reserved":
            return done
        return "duplicate" if operation.state == done else operation.state

    def close(self, name: str) -> None:
        self.values[name] = 0.0
        for operation in self.operations.values():
            operation.amounts.pop(name, None)  # a closed window is never written again


Run = Callable[[Coroutine[Any, Any, Any]], Any]

amounts = st.fixed_dictionaries(
    {},
    optional={
        "calls": st.sampled_from([0.0, 1.0, 2.0]),
        "usd": st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]),
        "tokens": st.sampled_from([0.0, 10.0, 100.0]),
    },
)


class LedgerMachine(RuleBasedStateMachine):
    """Subclass and set ``make_store`` (and ``run``, and ``faults`` for a remote store)."""

    run: Run
    #: (ledger, ``lose(on)``: whether replies are lost from now on, one that restarts it) —
    #: the last two ``None`` for a store that cannot lose replies.
    make_store: Callable[
        [], tuple[Ledger, Callable[[bool], None] | None, Callable[[], None] | None]
    ]

    operations = Bundle("operations")

    def __init__(self) -> None:
        super().__init__()
        self.ledger, self.lose, self.restart = type(self).make_store()
        self.model = LedgerModel()
        self.owner = f"m{next(_owners)}"
        self.ids = itertools.count()
        self.windows = {
            name: Window(store_key(self.owner, "window", name), unit, limit)
            for name, (unit, limit) in LIMITS.items()
        }

    def _lossy(self, lose: bool, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run an operation, every reply lost while it runs if ``lose`` (and the store can
        lose one): it raises ``StoreError``, whether or not its script ran."""
        if not lose or self.lose is None:
            return type(self).run(make())
        self.lose(True)
        try:
            return type(self).run(make())
        finally:
            self.lose(False)

    def _balance(self, window: Window) -> float:
        held: float = self._answer(lambda: self.ledger.balance(window))
        return held

    def _answer(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run an operation; on a lost reply send it again until the store answers."""
        while True:
            try:
                return type(self).run(make())
            except StoreError:
                continue

    @rule(
        target=operations,
        reserved=amounts,
        names=st.lists(st.sampled_from(sorted(LIMITS)), min_size=1, max_size=3, unique=True),
        floor=st.sampled_from([0.0, 0.0, 1.0, 3.0]),
        lose=st.booleans(),
    )
    def reserve(
        self, reserved: dict[str, float], names: list[str], floor: float, lose: bool
    ) -> str:
        op_id = store_key(self.owner, "op", str(next(self.ids)))
        floors = {"calls": floor} if "calls" in names else {}
        windows = [attrs.evolve(self.windows[name], floor=floors.get(name, 0.0)) for name in names]
        try:
            answer = self._lossy(lose, lambda: self.ledger.reserve(op_id, reserved, windows))
        except StoreError:
            # as a cap does: the call is refused, so its reservation is given back by id
            self._answer(lambda: self.ledger.release(op_id))
            self.model.operations[op_id] = ModelOperation("released", {})  # either way
            # whether the lost script ran is unknown: if it did, its floors stand (what
            # a session log says was spent stays counted; only the amount goes back)
            for name, floor in floors.items():
                before = self.model.values[name]
                held = self._balance(self.windows[name])
                assert abs(held - before) < EPSILON or abs(held - max(before, floor)) < EPSILON
                self.model.values[name] = held
            return op_id
        refused = self.model.reserve(op_id, reserved, names, floors)
        assert answer.granted == (refused is None), (answer, refused)
        if refused is not None:
            assert answer.window is not None
            assert answer.window.key == self.windows[refused].key
        return op_id

    @rule(
        op_id=operations,
        spent=amounts,
        lose=st.booleans(),
        again=st.booleans(),
    )
    def settle(self, op_id: str, spent: dict[str, float], lose: bool, again: bool) -> None:
        expected = self.model.answer("settle", op_id)
        try:
            answer = self._lossy(lose, lambda: self.ledger.settle(op_id, spent))
            assert answer == expected, (op_id, answer, expected)
        except StoreError:
            self._answer(lambda: self.ledger.settle(op_id, spent))  # sent again
        self.model.settle(op_id, spent)
        if again:  # a retried or late settle never counts twice
            expected = self.model.answer("settle", op_id)
            answer = self._answer(lambda: self.ledger.settle(op_id, {"usd": 99.0, "calls": 99.0}))
            assert answer == expected, (op_id, answer, expected)

    @rule(op_id=operations, lose=st.booleans())
    def release(self, op_id: str, lose: bool) -> None:
        """Released — or sent again after it ended either way (a retried cancellation)."""
        expected = self.model.answer("release", op_id)
        try:
            answer = self._lossy(lose, lambda: self.ledger.release(op_id))
            assert answer == expected, (op_id, answer, expected)
        except StoreError:
            self._answer(lambda: self.ledger.release(op_id))  # sent again
        self.model.release(op_id)
        if op_id not in self.model.operations:  # met only after a restart: a tombstone
            self.model.operations[op_id] = ModelOperation("released", {})

    @rule(op_id=operations)
    def reserve_again(self, op_id: str) -> None:
        """The same id reserved again — while it holds its reservation or after it ended
        (a retried request, a re-sent activity): a duplicate, granted unless it was
        released, and nothing is added twice."""
        operation = self.model.operations.get(op_id)
        if operation is None:
            return  # a restart forgot it: the id would start afresh (never reused)
        windows = list(self.windows.values())
        answer = self._answer(lambda: self.ledger.reserve(op_id, {"usd": 0.25}, windows))
        assert answer.duplicate
        assert answer.granted == (operation.state != "released"), (operation, answer)

    @rule(name=st.sampled_from(sorted(LIMITS)))
    def close(self, name: str) -> None:
        """A turn ends: its window goes, and the next turn's is another key."""
        self._answer(lambda: self.ledger.close([self.windows[name].key]))
        self.model.close(name)
        fresh = store_key(self.owner, "window", name, str(next(self.ids)))
        self.windows[name] = attrs.evolve(self.windows[name], key=fresh)

    @invariant()
    def every_window_holds_what_the_model_says(self) -> None:
        for name, window in self.windows.items():
            held = self._balance(window)
            assert abs(held - self.model.values[name]) < EPSILON, (name, held, self.model)

    @invariant()
    def no_reservation_passes_a_limit(self) -> None:
        """Only a settlement above its reservation can take a window past its limit."""
        for name, (_, limit) in LIMITS.items():
            if limit is None:
                continue
            reserved = sum(
                op.amounts.get(name, 0.0)
                for op in self.model.operations.values()
                if op.state == "reserved"
            )
            assert reserved <= limit + EPSILON


_owners = itertools.count()
