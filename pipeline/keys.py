"""Store keys built from typed parts, with an escaping no name can break.

A key names one logical entry: the layer application that owns it, what kind of
state it is, and the tool, model, conversation, tenant or window it is about.
``store_key("rate-limit", "bucket", "search")`` is ``rate-limit:bucket:search``.
Every part is escaped before the parts are joined with ``:`` — each byte of its
UTF-8 form (lone surrogates kept, as ``surrogatepass`` writes them) outside
``A-Z a-z 0-9 . _ ~ -`` becomes ``%XX`` — so ``:`` never appears inside a part and
splitting a key at ``:`` gives its parts back: no two different part lists give one
key. A tool named ``report:limit``, ``x:outcomes``, ``{tag}``, a newline or a lone
surrogate is just another name.

The first part is the owner (a plugin's namespace): a store that shards by key
(Redis Cluster) keeps every entry of one owner's accounting together, so one
server-side script never spans two shards.
"""

from __future__ import annotations

import itertools
import os
import re
import uuid
from typing import Final

__all__ = ["key_parts", "new_token", "store_key"]

_PLAIN: Final = re.compile(r"[A-Za-z0-9._~-]*")
_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-")
_ESCAPES: Final = tuple(chr(byte) if byte in _SAFE else f"%{byte:02X}" for byte in range(256))


def _escape(part: str) -> str:
    if _PLAIN.fullmatch(part):  # the usual name: nothing to escape
        return part
    return "".join([_ESCAPES[byte] for byte in part.encode("utf-8", "surrogatepass")])


def store_key(*parts: str) -> str:
    """One store key from its parts (owner first), escaped so that no two part lists
    give one key."""
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"a store key's parts are text, got {type(part).__name__}")
    return ":".join([_escape(part) for part in parts])


def key_parts(key: str) -> list[str]:
    """The parts ``store_key`` was given (its inverse)."""
    return [
        re.sub(
            r"(?:%[0-9A-F]{2})+",
            lambda run: bytes.fromhex(run.group().replace("%", "")).decode(
                "utf-8", "surrogatepass"
            ),
            part,
        )
        for part in key.split(":")
    ]


class _Tokens:
    """Tokens naming an operation or a turn in a store shared across processes: a random
    prefix per process (drawn again in a forked child, which would otherwise repeat its
    parent's) and a counter, instead of a uuid each."""

    def __init__(self) -> None:
        self.renew()
        if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
            os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.prefix = uuid.uuid4().hex
        self.counter = itertools.count()

    def new(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


_TOKENS: Final = _Tokens()


def new_token() -> str:
    """A token no other, in this process or another, has (only ``[0-9a-f]``: a key part
    that needs no escaping)."""
    return _TOKENS.new()
