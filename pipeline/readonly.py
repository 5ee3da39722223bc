"""Read-only JSON containers: the log's messages, handed out without copying.

Every model request is the session's messages; copying the whole history for each
request would make a step cost more as the conversation grows. Instead the log's
messages (and the tool schemas) are built once as these read-only ``dict`` and
``list`` subclasses: anything that serialises JSON reads them as usual, ``dict(m)``
and ``copy.deepcopy`` give ordinary mutable copies, and code that tries to change
one in place — a model adapter adding cache hints to the request it was handed —
gets a ``TypeError`` saying to copy first, instead of silently rewriting what the
log says was sent.
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

__all__ = ["ReadOnlyDict", "ReadOnlyList", "read_only"]

_MESSAGE = (
    "the session log's messages are read-only (what the model was sent must stay what "
    "the log says); copy before changing: dict(message), list(messages) or copy.deepcopy"
)


def _refuse(*_: object, **__: object) -> NoReturn:
    raise TypeError(_MESSAGE)


class ReadOnlyDict(dict[str, Any]):
    """A ``dict`` that refuses to change; its copies are plain dicts."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def copy(self) -> dict[str, Any]:
        return dict(self)

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class ReadOnlyList(list[Any]):
    """A ``list`` that refuses to change; its copies are plain lists."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def copy(self) -> list[Any]:
        return list(self)

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(value, memo) for value in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def read_only(value: Any) -> Any:
    """``value`` with every dict and list in it made read-only (other values as they are)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value  # the usual leaves, without an isinstance
    if isinstance(value, dict):
        return ReadOnlyDict({key: read_only(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return ReadOnlyList(read_only(item) for item in value)
    return value
