"""A ``StateStore`` and ``Ledger`` on Redis: one limit for every process that shares the server.

Run the same stack on four workers and a ``RateLimit(per_second=10)`` in memory admits
40 calls a second; with a ``RedisStore`` the four share one bucket, one breaker, one
set of bulkhead slots and one ledger of what the caps counted::

    from guardstack.integrations.redis import RedisStore
    from guardstack.pipeline import Harness

    harness = Harness(model, store=RedisStore("redis://localhost:6379/0"))

How it works (extra ``redis``: redis-py's asyncio client; Redis ≥ 6.2 or Valkey):

* every operation is one server-side Lua script, so it is atomic across processes and
  costs one round trip; time is read from the server (``TIME``), so the processes'
  clocks never disagree;
* soft state expires when idle (a bucket once it would be full again, a breaker's
  outcomes after their window, its state and a shared limit after ``idle_ttl_ms``);
  the ledger's windows live as long as they mean something — a calendar window until
  it ends, a session's for ``session_ttl_s`` after its last use, a turn's until the
  turn ends — and an operation's reservation for ``reservation_ttl_s``;
* every key carries a Redis Cluster hash tag: a soft entry its own, the ledger's
  entries their owner's (the plugin's namespace), so one script never spans slots;
* a bulkhead slot is a lease that expires after ``lease_ms`` unless renewed: while a
  call runs, the store renews its leases every third of that, so a process killed
  mid-call gives its slots back within one lease; a breaker's half-open probe is held
  and renewed the same way. A slot whose acquire went unanswered (a timeout, a lost
  reply) is given back at the next contact, and a reservation given up on the same
  way is released by its id;
* a server that is down, slower than ``timeout_ms`` or answers garbage raises
  ``StoreError`` and each layer does what ``on_error`` says (``None``: caps and spend
  limits fail closed; breakers, rate limits and concurrency limits fail open).
  Redis restarted mid-run: the next operations reconnect, soft state rebuilds, and a
  session's counts go on from the larger of what the store and the session log hold.

It runs on asyncio only (redis-py's client is asyncio's): built in a trio program, or
used from one, it raises ``StoreUnsupported`` — a mistake, not an outage.

The package by job: ``store`` (``RedisStore``) and ``scripts`` (its Lua scripts).
"""

from guardstack.integrations.redis.store import RedisStore

__all__ = ["RedisStore"]
