"""Pulse: a zero-byte append to each journal (queue `pulse`).

A zero-byte append is a transaction barrier: it synchronizes the journal's
pipeline (every replica acknowledges the same fragment), and the coordinator
checks roll triggers on it, so a spool older than the journal's flush interval
is rolled — and persisted — even when nobody writes to the journal.

`suspend="no-resume"`, as Gazette's own pulse: pulsing a suspended journal must
not wake it (it answers SUSPENDED, which is fine).

Beat runs `workers.pulse.sweep` every `QUIRE_WORKER_PULSE_INTERVAL` seconds; it
reads the journal list from etcd once and fans out one `pulse_journal` per
journal. A Redis lock keeps two overlapping sweeps from doubling the work.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from quire.client.client import Client
from protocol.logs import bind, get_logger
from protocol import Status, SuspendLevel
from protocol.credentials import settings_token
from protocol.errors import StatusError
from protocol.tls import settings_client_ssl
from workers import common, watermark
from workers.app import app
from workers.errors import MAINTENANCE_RETRY, JournalUnknown, PulseFailed
from workers.topology import read_journal

__all__ = ["pulse_journal", "sweep"]

log = get_logger(__name__)

# Statuses that mean "the barrier was not needed / cannot apply", not a failure.
_BENIGN = {Status.SUSPENDED, Status.NOT_ALLOWED, Status.JOURNAL_NOT_FOUND}


async def _pulse(journal: str) -> dict[str, Any]:
    ws = common.worker_settings()
    s = common.settings()
    jt = await read_journal(s.etcd_url, s.etcd_root, journal, timeout=ws.io_timeout)
    if jt is None:
        raise JournalUnknown(f"journal {journal} has no spec")
    if not jt.endpoints:
        raise PulseFailed(f"journal {journal} has no assigned coordinator yet")
    client = Client(list(jt.endpoints), connect_timeout=min(5.0, ws.io_timeout),
                    rpc_timeout=ws.io_timeout, retry_timeout=ws.io_timeout,
                    token=settings_token(s), ssl=settings_client_ssl(s))
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


@app.task(name="workers.pulse.sweep", bind=True, ignore_result=True,
          **MAINTENANCE_RETRY)
def sweep(self: Any) -> int:
    ws = common.worker_settings()
    with common.sweep_topology("pulse", ws.pulse_interval) as topo:
        if topo is None:
            log.info("another pulse sweep is running; skipping")
            return 0
        names = [name for name, jt in sorted(topo.journals.items())
                 if jt.spec.suspend.level != SuspendLevel.FULL]
        for name in names:
            pulse_journal.apply_async(args=[name], expires=ws.pulse_interval)
        log.info("pulse sweep", journals=len(names))
        return len(names)
