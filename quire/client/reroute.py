"""Appends waiting on a primary that is gone: ask elsewhere, and stop waiting once the
journal has moved (the pool's watchdog drives it; no task or timer per append).

Across hosts a primary can vanish without a word: its host's link goes down, and a
socket whose peer is cut gets no RST, so an append sent to it waits on TCP
retransmissions for as long as its RPC timeout allows — long after the lease expired
and another coordinator took the journal (`quire chaos --hosts 5`, lease TTL 5 s,
attempts bounded at TTL + 1 s: up to 9.8 s from isolating a primary's host to the next
acknowledged append on its journal).

So an append unanswered for STALL_AFTER seconds is *stalled*: every PROBE_INTERVAL
the client asks another coordinator — the members of the journal's cached route and
the seeds in turn, never the one it waits on — for the journal's route as its etcd
watch has it (a non-blocking metadata read, `do_not_proxy`: answered from its own
view, never forwarded). Once a probe names a primary other than the one the append was
sent to, and the append is still unanswered `grace` seconds later, its connection is
aborted: the attempt fails with `retry.Rerouted`, the route cache already holds the new
route, and the client resends at once where it now points.

Exactly-once is unchanged: an aborted attempt whose commit was sent is an unknown
outcome, exactly as after an RPC timeout (client.py): identified appends are re-sent
(the new primary deduplicates them), explicit-offset ones re-sent at their offset,
plain ones raise CommitUnknown. Their grace differs: an identified append loses
nothing by being aborted early (grace 0), a plain or explicit-offset one would turn an
answer the old primary might still give — the journal moved for a rebalance, not a
failure — into an unknown outcome, so it waits REROUTE_GRACE first (a live former
primary learns of the move as fast as the coordinator we asked, and answers).

An append sent to a coordinator that proxies (no cached route) expects no particular
primary: the first probe's answer becomes the one expected.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

from protocol import ReadRequest

from .connection import Connection, ConnectionPool
from .routes import RouteCache

__all__ = ["PROBE_INTERVAL", "REROUTE_GRACE", "STALL_AFTER", "Rerouter", "probe_primary"]

STALL_AFTER = 1.0
"""Seconds without an answer after which an append's route is checked elsewhere."""
PROBE_INTERVAL = 0.25
"""Seconds between route probes of a journal while an append to it is stalled; also
the watchdog's period while any append is stalled."""
PROBE_TIMEOUT = 1.0
"""Seconds one probe (connect, hello, one metadata read) may take."""
REROUTE_GRACE = 1.0
"""Seconds a plain or explicit-offset append still waits after its journal moved."""

Probe = Callable[[str, str], Awaitable["str | None"]]
"""(journal, endpoint not to ask) -> the journal's primary endpoint as another
coordinator sees it, or None if it could not tell."""


_probe_rr = itertools.count()


async def probe_primary(routes: RouteCache, pool: ConnectionPool, journal: str,
                        avoid: str) -> str | None:
    """The journal's primary endpoint as another coordinator's etcd view has it: a
    non-blocking metadata read with `do_not_proxy`, so a member answers from its replica
    and anyone else with NOT_JOURNAL_BROKER — both carry the route, neither forwards to
    the primary we wait on. Asks a member of the cached route or a seed, in turn, never
    `avoid`; the route it names refreshes the cache unless older than it."""
    route = routes.get(journal)
    candidates = [e for e in (route.endpoints if route is not None else ()) if e and e != avoid]
    candidates += [s for s in routes.seeds if s != avoid and s not in candidates]
    if not candidates:
        return None
    up = [c for c in candidates if not routes.is_down(c)] or candidates
    endpoint = up[next(_probe_rr) % len(up)]
    conn = pool.take(endpoint) or await Connection.open(
        endpoint, min(pool.connect_timeout, PROBE_TIMEOUT), pool.token, pool.ssl)
    try:
        await conn.send(ReadRequest(journal=journal, offset=-1, metadata_only=True,
                                    do_not_proxy=True))
        frame = await conn.read(PROBE_TIMEOUT)
    finally:
        conn.abort()  # (one frame of a read RPC: not worth keeping in step)
    header = getattr(frame.message, "header", None)
    return routes.observe(journal, header) if header is not None else None


class Rerouter:
    """The stalled-append bookkeeping of one ConnectionPool (its watchdog calls tick)."""

    period = PROBE_INTERVAL
    """The watchdog's period while an append is stalled."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self._last: dict[str, float] = {}
        """journal -> when its last probe started."""
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def tick(self, now: float, watched: dict[Connection, float]) -> bool:
        """Abort stalled attempts whose journal moved (past their grace) and start the
        probes that are due; True while any watched append is stalled."""
        stalled = False
        for conn in list(watched):
            if not conn.journal or now - conn.since < STALL_AFTER:
                continue
            stalled = True
            if conn.moved_to and now - conn.moved_at >= conn.grace:
                watched.pop(conn, None)
                self._abort(conn)
                continue
            journal = conn.journal
            if journal not in self._tasks and now - self._last.get(journal, 0.0) >= PROBE_INTERVAL:
                self._last[journal] = now
                self._tasks[journal] = asyncio.get_running_loop().create_task(
                    self._probe(journal, conn.endpoint, watched))
        if not stalled:
            self._last.clear()
        return stalled

    @staticmethod
    def _abort(conn: Connection) -> None:
        conn.rerouted = conn.moved_to
        conn.abort()

    async def _probe(self, journal: str, avoid: str, watched: dict[Connection, float]) -> None:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                primary = await self.probe(journal, avoid)
        except Exception:  # noqa: BLE001 - no answer says nothing; the next probe asks another
            primary = None
        finally:
            self._tasks.pop(journal, None)
        if not primary:
            return
        now = time.monotonic()
        for conn in list(watched):
            if conn.journal != journal:
                continue
            if primary == conn.endpoint:
                # The journal moved to where this append went (sent to it as a proxy, or
                # an earlier probe was behind): it answers as primary now; abandoning it
                # would turn that answer into an unknown outcome.
                conn.expect, conn.moved_to = primary, ""
            elif not conn.expect:
                conn.expect = primary  # sent to a proxy: expect what it forwards to
            elif primary == conn.expect:
                conn.moved_to = ""  # (moved back)
            elif not conn.moved_to:
                conn.moved_to, conn.moved_at = primary, now
                if conn.grace <= 0.0:
                    watched.pop(conn, None)
                    self._abort(conn)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
