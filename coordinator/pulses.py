"""Pulses: the zero-byte appends a primary sends through the ordinary append FSM.

A pulse synchronizes a route: the primary builds its pipeline, every replica rolls its
spool to the same offset, and the route is advertised in etcd (Gazette's pulse). Hosting
asks for one whenever this member becomes a journal's primary or the route it leads
changes (`want`), and `run` pulses every journal it leads once per pulse interval (so an
idle journal's fragment is flushed and the replicas' health is checked).

Pulses asked for by `want` are one-shot tasks (an idle journal costs none), at most
PULSE_CONCURRENCY at a time, each retried with backoff up to PULSE_ATTEMPTS times while
the route it was for is still ours. The periodic round runs in `run`'s own task with
PULSE_CONCURRENCY pulsers (no task per journal per interval); a journal whose periodic
pulse did not sync is handed to the retrying kind. A pulse that ends without syncing, or
during which `want` came again (a newer route), asks Hosting to re-evaluate its journal
(`changed(journal)`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from protocol import AppendRequest, Route, Status
from protocol.logs import get_logger

from .append_fsm import AppendFSM, State

if TYPE_CHECKING:
    from .host import Host
    from .resolver import Resolution

__all__ = ["PULSE_ATTEMPTS", "PULSE_CONCURRENCY", "Pulses"]

log = get_logger(__name__)

PULSE_CONCURRENCY = 32
PULSE_ATTEMPTS = 8


class _Barrier:
    """A content source with no content: the append is a transaction barrier."""

    async def next_chunk(self) -> None:
        return None


class Pulses:
    def __init__(self, server: Host, resolve_now: Callable[[str], Resolution],
                 spawn: Callable[[Coroutine[Any, Any, None], str], None],
                 changed: Callable[[str], None], interval: float) -> None:
        self.server = server
        self._resolve_now = resolve_now
        self._spawn = spawn
        self._changed = changed
        self.interval = interval
        self._synced: dict[str, Route] = {}
        """The route each journal was last synchronized for by one of our pulses."""
        self._running: set[str] = set()
        self._again: set[str] = set()
        """Journals `want`ed while a pulse of theirs ran: re-evaluated when it ends (that
        pulse was for the route before; without this the new route waited for the next
        periodic round, up to a pulse interval, with a member added and not advertised)."""
        self._sem = asyncio.Semaphore(PULSE_CONCURRENCY)
        self.stopped = False

    def forget(self, journal: str | None = None) -> None:
        """The next `want` pulses `journal` (every journal: None) again."""
        if journal is None:
            self._synced.clear()
        else:
            self._synced.pop(journal, None)

    def want(self, journal: str, route: Route) -> None:
        """Pulse `journal`, which we lead on `route`, unless that route is synced already
        or a pulse of the journal is running."""
        if self._synced.get(journal) != route:
            self._start(journal, route)

    def _start(self, journal: str, route: Route) -> None:
        if journal in self._running:
            self._again.add(journal)
        else:
            self._running.add(journal)
            self._spawn(self._until_synced(journal, route), f"pulse:{journal}")

    def _asked_again(self, journal: str) -> bool:
        """Whether `want` came for `journal` while its pulse ran (and forget it)."""
        if journal in self._again:
            self._again.discard(journal)
            return True
        return False

    async def pulse(self, journal: str) -> AppendFSM:
        req = AppendRequest(journal=journal, do_not_proxy=True, suspend="no-resume")
        fsm = AppendFSM(self.server, req, _Barrier())
        async with self._sem:
            await fsm.run()
        return fsm

    def _settled(self, journal: str, route: Route, fsm: AppendFSM) -> bool:
        """Whether `fsm`, a pulse of `journal` on `route`, leaves nothing to retry."""
        # A suspended journal answers a (no-resume) pulse SUSPENDED, after its
        # pipeline synced: that is as good as a pulse gets for it.
        if fsm.state is State.FINISHED or fsm.status == Status.SUSPENDED:
            self._synced[journal] = route
            return True
        if fsm.status == Status.INDEX_HAS_GREATER_OFFSET:
            # Synchronized, and refusing appends until an operator's reset-head
            # (fail-to-safety): pulsing again changes nothing. Said once per
            # route (and at each periodic pulse), with the runbook's words.
            log.warning("journal refuses appends until reset-head", journal=journal,
                        message=fsm.message)
            self._synced[journal] = route
            return True
        return False

    async def _until_synced(self, journal: str, route: Route) -> None:
        delay = 0.05
        try:
            for _ in range(PULSE_ATTEMPTS):
                if self.stopped:
                    return
                try:
                    fsm = await self.pulse(journal)
                except Exception:  # noqa: BLE001 - a pulse must never take the process down
                    log.exception("pulse crashed; retrying", journal=journal)
                    await asyncio.sleep(delay)  # backoff between attempts
                    delay = min(delay * 2, 2.0)
                    continue
                if self._settled(journal, route, fsm):
                    return
                now = self._resolve_now(journal)
                if not now.is_primary or now.route != route:
                    return  # the next reconcile pulses the new route
                log.info("pulse failed; retrying", journal=journal, status=fsm.status.name,
                         message=fsm.message, delay=delay)
                await asyncio.sleep(delay)  # backoff between attempts, not a readiness guess
                delay = min(delay * 2, 2.0)
        finally:
            self._running.discard(journal)
            if self._asked_again(journal) or self._synced.get(journal) != route:
                self._changed(journal)  # re-evaluate (another attempt if still primary)

    async def run(self) -> None:
        """Periodic pulse of every journal we are primary of (flush interval, health)."""
        while True:
            await asyncio.sleep(self.interval)
            await self.round()

    async def round(self) -> None:
        """One periodic pulse of every journal we lead, by PULSE_CONCURRENCY pulsers in
        this task (no task per journal: thousands of idle journals cost one loop). A
        pulse that does not sync hands its journal to `_start`, which retries it."""
        due = iter([journal for journal in list(self.server.replicas)
                    if journal not in self._running])

        async def pulser() -> None:
            for journal in due:  # (one shared iterator: each journal is taken once)
                if self.stopped:
                    return
                res = self._resolve_now(journal)
                if not res.is_primary or journal in self._running:
                    continue
                self._running.add(journal)
                try:
                    fsm = await self.pulse(journal)
                    synced = self._settled(journal, res.route, fsm)
                except Exception:  # noqa: BLE001 - a pulse must never take the process down
                    log.exception("pulse crashed; retrying", journal=journal)
                    synced = False
                finally:
                    self._running.discard(journal)
                if not synced:
                    self._start(journal, res.route)
                elif self._asked_again(journal):
                    self._changed(journal)  # its route changed while the round pulsed it

        await asyncio.gather(*(pulser() for _ in range(PULSE_CONCURRENCY)))
