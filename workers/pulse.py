"""Pulse: a zero-byte append to each journal (queue `pulse`).

A zero-byte append is a transaction barrier: it synchronizes the journal's
pipeline (every replica acknowledges the same fragment), and the coordinator
checks roll triggers on it, so a spool older than the journal's flush interval
is rolled — and persisted — even when nobody writes to the journal.

`suspend="no-resume"`, as Gazette's own pulse: pulsing a suspended journal must
not wake it (it answers SUSPENDED, which is fine).

Beat runs `workers.pulse.sweep` every `QUIRE_WORKER_PULSE_INTERVAL` seconds; it
reads the topology from etcd once and sends one `pulse_member` per primary member
(per PULSE_BATCH of its journals): over one client to that member it pulses them,
PULSE_CONCURRENCY at a time, and records their marks — no etcd read, connection and
event loop per journal, which at thousands of journals kept the workers busy and etcd
loaded all the time (#49). A journal with no primary yet, or whose pulse in a batch
failed, gets its own `pulse_journal` (with its retries). A Redis lock keeps two
overlapping sweeps from doubling the work.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol.logs import bind, get_logger
from protocol import Status, SuspendLevel
from protocol.errors import StatusError
from workers import common, watermark
from workers.app import app
from workers.errors import MAINTENANCE_RETRY, JournalUnknown, PulseFailed
from workers.topology import Topology, read_journal

__all__ = ["PULSE_BATCH", "PULSE_CONCURRENCY", "plan", "pulse_journal", "pulse_member", "sweep"]

log = get_logger(__name__)

# Statuses that mean "the barrier was not needed / cannot apply", not a failure.
_BENIGN = {Status.SUSPENDED, Status.NOT_ALLOWED, Status.JOURNAL_NOT_FOUND}

PULSE_BATCH = 500
"""Most journals of one `pulse_member` task."""
PULSE_CONCURRENCY = 16
"""Pulses in flight at once within one `pulse_member` task."""


def plan(topo: Topology) -> tuple[dict[str, list[str]], list[str]]:
    """The journals to pulse by their primary's endpoint, and those with none yet
    (fully suspended journals are left out: a pulse must not wake them)."""
    by_member: dict[str, list[str]] = {}
    unassigned: list[str] = []
    for name, jt in sorted(topo.journals.items()):
        if jt.spec.suspend.level == SuspendLevel.FULL:
            continue
        primary = jt.primary_endpoint
        if primary:
            by_member.setdefault(primary, []).append(name)
        else:
            unassigned.append(name)
    return by_member, unassigned


async def _pulse_many(endpoint: str, journals: list[str]) -> dict[str, Any]:
    """Pulse `journals` over one client to their primary `endpoint`."""
    ws = common.worker_settings()
    client = common.coordinator_client([endpoint])
    todo = iter(journals)
    marks: list[tuple[str, float, int]] = []
    failed: list[str] = []
    benign = 0

    async def pulser() -> None:
        nonlocal benign
        for journal in todo:  # (one shared iterator: each journal is taken once)
            sent = time.time()  # the mark's time: every append acknowledged before it is < end
            try:
                result = await asyncio.wait_for(
                    client.append(journal, b"", suspend="no-resume"), ws.io_timeout * 2)
            except StatusError as exc:
                if exc.status in _BENIGN:
                    benign += 1
                else:
                    failed.append(journal)
                continue
            except Exception:  # noqa: BLE001 - retried alone, as its own pulse_journal
                failed.append(journal)
                continue
            marks.append((journal, sent, result.end))

    try:
        await asyncio.gather(*(pulser() for _ in range(min(PULSE_CONCURRENCY, len(journals)))))
    finally:
        await client.close()
    for journal, sent, end in marks:
        watermark.record_mark(journal, sent, end)
    return {"endpoint": endpoint, "journals": len(journals), "ok": len(marks),
            "benign": benign, "failed": failed}


async def _pulse(journal: str) -> dict[str, Any]:
    ws = common.worker_settings()
    s = common.settings()
    jt = await read_journal(s.etcd_url, s.etcd_root, journal, timeout=ws.io_timeout)
    if jt is None:
        raise JournalUnknown(f"journal {journal} has no spec")
    if not jt.endpoints:
        raise PulseFailed(f"journal {journal} has no assigned coordinator yet")
    client = common.coordinator_client(list(jt.endpoints))
    try:
        sent = time.time()  # the mark's time: every append acknowledged before it is < end
        result = await asyncio.wait_for(
            client.append(journal, b"", suspend="no-resume"), ws.io_timeout * 2)
    except StatusError as exc:
        if exc.status in _BENIGN:
            return {"journal": journal, "status": exc.status.name}
        raise PulseFailed(f"pulse of {journal}: {exc}") from exc
    except asyncio.TimeoutError as exc:
        raise PulseFailed(f"pulse of {journal} timed out") from exc
    finally:
        await client.close()
    watermark.record_mark(journal, sent, result.end)
    return {"journal": journal, "status": "OK", "end": result.end}


@app.task(name="workers.pulse.pulse_journal", bind=True, ignore_result=True,
          **MAINTENANCE_RETRY)
def pulse_journal(self: Any, journal: str) -> dict[str, Any]:
    with bind(journal=journal, task_id=self.request.id):
        try:
            out = asyncio.run(_pulse(journal))
        except JournalUnknown:
            log.info("journal deleted; nothing to pulse")
            return {"journal": journal, "status": "JOURNAL_NOT_FOUND"}
        log.debug("pulsed", **out)
        return out


@app.task(name="workers.pulse.pulse_member", bind=True, ignore_result=True)
def pulse_member(self: Any, endpoint: str, journals: list[str]) -> dict[str, Any]:
    with bind(endpoint=endpoint, task_id=self.request.id):
        out = asyncio.run(_pulse_many(endpoint, list(journals)))
        ws = common.worker_settings()
        for journal in out["failed"]:
            pulse_journal.apply_async(args=[journal], expires=ws.pulse_interval)
        log.info("pulsed a member's journals", journals=out["journals"], ok=out["ok"],
                 benign=out["benign"], failed=len(out["failed"]))
        return {**out, "failed": len(out["failed"])}


@app.task(name="workers.pulse.sweep", bind=True, ignore_result=True,
          **MAINTENANCE_RETRY)
def sweep(self: Any) -> int:
    ws = common.worker_settings()
    with common.sweep_topology("pulse", ws.pulse_interval) as topo:
        if topo is None:
            log.info("another pulse sweep is running; skipping")
            return 0
        by_member, unassigned = plan(topo)
        tasks = 0
        for endpoint, names in sorted(by_member.items()):
            for k in range(0, len(names), PULSE_BATCH):
                pulse_member.apply_async(args=[endpoint, names[k:k + PULSE_BATCH]],
                                         expires=ws.pulse_interval)
                tasks += 1
        for name in unassigned:
            pulse_journal.apply_async(args=[name], expires=ws.pulse_interval)
        total = sum(map(len, by_member.values())) + len(unassigned)
        log.info("pulse sweep", journals=total, members=len(by_member),
                 tasks=tasks + len(unassigned))
        return total
