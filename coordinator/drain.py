"""Graceful drain on SIGTERM (Gazette's "graceful drain and persist on exit").

A coordinator asked to stop, in order, within one bound (`--drain-timeout`):

1. stops accepting connections and lets in-flight appends finish (the rest are
   cancelled later and roll back);
2. rolls the non-empty spool of every journal it is primary of, with a roll proposal
   through the journal's pipeline, so every replica closes the same fragment; the
   closed fragments go to the persister as the primary's (sent at once);
3. marks its member `exiting`, so the allocator moves its journals;
4. with a Redis persister, sends everything still pending now and waits until the
   fragment index shows the fragments of the journals it leads persisted; then stays
   a moment (PEER_ROLL_GRACE) for the exit rolls of primaries stopping with it;
5. withdraws (cancels connections, tears pipelines down), and then records each
   replica's write head in the spool directory (`record_heads`), where the next
   incarnation resumes its spool: the offsets below the head were written, so a plain
   append continues there instead of failing with INDEX_HAS_GREATER_OFFSET (or, worse,
   starting over at an offset already written). Its lease is revoked last. Every
step is bounded by the same deadline; a step that runs out of time is logged and
skipped, never retried past the bound.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from protocol.logs import get_logger
from protocol import Fragment

from .pipeline import PipelineBroken
from .recovery import write_head
from .replica import Replica, acquire_within

if TYPE_CHECKING:
    from .host import Host
    from .hosting import Hosting

__all__ = ["drain", "record_heads"]

log = get_logger(__name__)

PEER_ROLL_GRACE = 2.0
"""How long a replica stays for its primaries' exit rolls (they usually stop with us)."""


async def drain(server: Host, hosting: Hosting) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + server.cfg.drain_timeout

    def remaining() -> float:
        return max(0.0, deadline - loop.time())

    await _appends_finished(server, remaining())
    led = [r for r in list(server.replicas.values()) if _is_primary(hosting, r.journal)]
    rolled = [f for f in await asyncio.gather(*(_roll(r, remaining()) for r in led)) if f]
    if rolled:
        log.info("rolled led spools for exit", journals=len(rolled),
                 bytes=sum(f.end - f.begin for f in rolled))
    await hosting.set_exiting()
    await _persisted(server, rolled, {r.journal for r in led}, remaining())
    await _peer_rolls(hosting, [r for r in list(server.replicas.values()) if r not in led],
                      min(remaining(), PEER_ROLL_GRACE))


def record_heads(server: Host) -> None:
    """The last step, once no stream can change a spool any more (a peer primary's
    exit roll may have emptied ours meanwhile): the next incarnation's start."""
    for r in list(server.replicas.values()):
        spool = r.spool
        if spool.content_length == 0 and spool.delta == 0 and spool.end > 0:
            try:
                write_head(server.files, r.journal, spool.fragment, spool.registers,
                           spool.producers.snapshot() if spool.producers else None)
            except OSError as exc:
                log.warning("cannot record the write head", journal=r.journal, error=repr(exc))


def _is_primary(hosting: Hosting, journal: str) -> bool:
    resolver = hosting.resolver
    return resolver is not None and resolver.resolve_now(journal).is_primary


async def _appends_finished(server: Host, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            await server.appends_idle.wait()
    except TimeoutError:
        log.warning("appends still in flight at shutdown; rolling them back",
                    count=server.appends_in_flight)


async def _roll(replica: Replica, timeout: float) -> Fragment | None:
    """Roll a led journal's non-empty spool through its pipeline; the closed fragment."""
    pln = replica.pipeline
    if pln is None or pln.broken is not None or not pln.synced or not replica.spool.content_length:
        return None
    if not await acquire_within(replica.pipeline_lock, timeout):
        log.warning("pipeline busy at exit; spool not rolled", journal=replica.journal)
        return None
    try:
        spool = replica.spool
        if replica.pipeline is not pln or pln.broken is not None or spool.delta \
                or not spool.content_length:
            return None
        closed = spool.fragment
        pln.send_proposal(spool.roll_proposal(acknowledge=True))
        ticket = pln.ticket(must_ok=True)
    except PipelineBroken as exc:
        log.warning("spool not rolled at exit", journal=replica.journal, error=str(exc))
        return None
    finally:
        replica.pipeline_lock.release()
    try:
        async with asyncio.timeout(max(timeout, 0.001)):
            await pln.drain()
            await pln.gather_ok(ticket)
    except (TimeoutError, PipelineBroken) as exc:
        # The local spool closed the fragment (it is on disk and with the persister);
        # a peer that did not acknowledge keeps its copy open, as after any failure.
        log.warning("a peer did not acknowledge the exit roll", journal=replica.journal,
                    error=repr(exc))
    return closed


async def _peer_rolls(hosting: Hosting, replicas: list[Replica], timeout: float) -> None:
    """Stay (briefly) for the exit rolls of primaries that stop with us, as all the
    coordinators of `quire up` do: withdrawing first would break their pipelines, and
    their spools — and ours — would be lost to the restart instead of rolled."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for r in replicas:
        while r.spool.content_length and not _is_primary(hosting, r.journal) \
                and loop.time() < deadline:
            await r.wait_change(deadline - loop.time())  # woken by the roll (on_closed)


async def _persisted(server: Host, rolled: list[Fragment], led: set[str],
                     timeout: float) -> None:
    persister = server.persister
    wait = getattr(persister, "wait_persisted", None)
    if not server.cfg.redis_url or wait is None:
        return
    persister.flush()  # Gazette's Finish: nothing waits for its next turn any more
    fragments = {(f.journal, f.begin, f.end, f.sum): f for f in
                 [*rolled, *(f for f in persister.pending() if f.journal in led)]}
    if not fragments:
        return
    left = await wait(fragments.values(), timeout)
    if left:
        log.warning("exiting before the index showed these fragments persisted; they stay "
                    "on local disk and are sent again at the next start", count=len(left),
                    bytes=sum(f.end - f.begin for f in left))
    else:
        log.info("fragments of led journals persisted before exit", count=len(fragments))
