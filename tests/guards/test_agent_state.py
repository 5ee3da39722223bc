"""Turn tokens: unique in a process, and a forked child does not repeat its parent's."""

from __future__ import annotations

import os
import warnings

from guardstack.guards.agent_state import new_turn_token


def test_turn_tokens_never_repeat_in_a_process() -> None:
    tokens = [new_turn_token() for _ in range(10_000)]
    assert len(set(tokens)) == len(tokens)


def test_a_forked_child_draws_tokens_of_its_own() -> None:
    """Workers forked after import (gunicorn, multiprocessing) share a store: their turns
    must not collide with the parent's or each other's."""
    new_turn_token()
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when forking a process that has threads (earlier tests
        # leave idle worker threads); the child only writes to a pipe and exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(write, new_turn_token().encode())
        os._exit(0)
    os.close(write)
    in_child = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(child, 0)
    in_parent = new_turn_token()
    assert in_child
    assert in_child[:32] != in_parent[:32]  # another process prefix
    assert in_child != in_parent
