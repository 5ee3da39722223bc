"""The log's messages are handed out read-only: equal to what was logged, refusing every
change in place with a message that says to copy, and copied into plain containers."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline.readonly import ReadOnlyDict, ReadOnlyList, read_only

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=10,
)


def _containers(value: Any) -> list[Any]:
    found = [value] if isinstance(value, dict | list) else []
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    )
    for child in children:
        found.extend(_containers(child))
    return found


@given(value=json_values)
def test_a_read_only_value_reads_as_the_value_and_every_container_in_it_refuses(
    value: Any,
) -> None:
    frozen = read_only(value)
    assert frozen == value
    assert json.dumps(frozen, sort_keys=True) == json.dumps(value, sort_keys=True)
    for container in _containers(frozen):
        assert type(container) in (ReadOnlyDict, ReadOnlyList)
        with pytest.raises(TypeError, match="copy before changing"):
            container.clear()
    for made in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(frozen))):
        assert made == value
        assert all(type(c) in (dict, list) for c in _containers(made))


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.__setitem__("k", 1),
        lambda d: d.__delitem__("a"),
        lambda d: d.update(k=1),
        lambda d: d.setdefault("k", 1),
        lambda d: d.pop("a"),
        lambda d: d.popitem(),
    ],
)
def test_a_read_only_dict_refuses_each_change(change: Any) -> None:
    message = read_only({"a": 1})
    with pytest.raises(TypeError, match="session log's messages are read-only"):
        change(message)
    assert message == {"a": 1}
    plain = dict(message) | {"k": 1}  # a copy changes as usual
    assert plain == {"a": 1, "k": 1}


@pytest.mark.parametrize(
    "change",
    [
        lambda items: items.append(1),
        lambda items: items.extend([1]),
        lambda items: items.insert(0, 1),
        lambda items: items.__setitem__(0, 9),
        lambda items: items.sort(),
        lambda items: items.reverse(),
        lambda items: items.remove(1),
    ],
)
def test_a_read_only_list_refuses_each_change(change: Any) -> None:
    messages = read_only([1, 2])
    with pytest.raises(TypeError, match="read-only"):
        change(messages)
    assert messages == [1, 2]
    assert type(messages.copy()) is list
    assert type(copy.copy(messages)) is list
