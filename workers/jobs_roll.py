"""Windows that complete by themselves: the scheduler's side of a journal whose open
fragment holds a window's last bytes (docs/jobs.md, "Windows that complete by
themselves").

For each job the sweep calls `waits`: for every journal whose watermark is short of
the next window's end plus `delay`, it gathers what that journal waits on (Redis: the
pulse marks, the persisted-through offset, the last roll request), asks
workers/jobs_wait.py (pure) why and whether to roll, and sends `roll_journal` for those
that need it. `roll_journal` (queue `jobs`) is a zero-byte append with
`roll_below = H`: the primary closes its open fragment first if that holds bytes below
`H` — then the ordinary persist path stores it and the watermark passes the window.

Each request and its answer are kept in the Redis hash `quire:jobs:rolls`
(journal -> JSON `{below, at, done, error}`), so the status note says what happened and
a request is repeated at most once per `retry_after`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from protocol.logs import bind, get_logger
from workers import common, watermark
from workers.app import app
from workers.jobs_wait import JournalWait, RollRecord, assess
from workers.topology import read_journal

__all__ = ["ROLLS_KEY", "roll_journal", "waits"]

log = get_logger(__name__)

ROLLS_KEY = "quire:jobs:rolls"
MAX_REASONS = 3


def roll_after() -> float:
    """Seconds a window's mark is left for the open fragment to fill (and close by
    length) before the scheduler closes it: two jobs sweeps, at least 5 s."""
    return max(5.0, 2 * common.worker_settings().jobs_interval)


def retry_after() -> float:
    return max(30.0, 6 * common.worker_settings().jobs_interval)


def _records(journals: list[str]) -> dict[str, RollRecord]:
    out: dict[str, RollRecord] = {}
    if not journals:
        return out
    for j, raw in zip(journals, common.redis_client().hmget(ROLLS_KEY, journals), strict=True):
        if raw:
            try:
                d = json.loads(raw)
                out[j] = RollRecord(below=int(d["below"]), at=float(d["at"]),
                                    done=float(d.get("done", 0.0)), error=str(d.get("error", "")))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _record(journal: str, rec: RollRecord) -> None:
    common.redis_client().hset(ROLLS_KEY, journal, json.dumps(
        {"below": rec.below, "at": rec.at, "done": rec.done, "error": rec.error}))


def gather(journals: list[str], needed: float) -> list[JournalWait]:
    """What each of `journals` waits on for a watermark of `needed` (Redis reads)."""
    through = watermark.read_persisted(journals)
    rolls = _records(journals)
    out = []
    for j in journals:
        mark = watermark.first_mark(j, needed)
        p = through.get(j)
        since = watermark.last_mark_through(j, p, needed) if mark and p is not None else 0.0
        out.append(JournalWait(journal=j, needed=needed, mark=mark, through=p, since=since,
                               roll=rolls.get(j)))
    return out


def waits(lagging: list[str], needed: float, now: float) -> str:
    """Why the window needing watermark `needed` waits on `lagging` (lowest watermark
    first); sends the roll requests that are due. The status note's reason."""
    if not lagging or needed > now:
        return ""
    ws = common.worker_settings()
    reasons = []
    for w in gather(lagging, needed):
        reason, roll = assess(w, now=now, roll_after=roll_after(), retry_after=retry_after(),
                              pulse_interval=ws.pulse_interval)
        reasons.append(reason)
        if roll and w.mark is not None:
            _record(w.journal, RollRecord(below=w.mark[1], at=now))
            roll_journal.apply_async(args=[w.journal, w.mark[1]], queue="jobs",
                                     expires=retry_after())
            log.info("asking a primary to close its open fragment", journal=w.journal,
                     below=w.mark[1], window_needs=needed)
    more = len(reasons) - MAX_REASONS
    return "; ".join(reasons[:MAX_REASONS]) + (f"; and {more} more" if more > 0 else "")


async def _roll(journal: str, below: int) -> int:
    ws = common.worker_settings()
    s = common.settings()
    jt = await read_journal(s.etcd_url, s.etcd_root, journal, timeout=ws.io_timeout)
    if jt is None:
        raise LookupError(f"journal {journal} has no spec")
    if not jt.endpoints:
        raise LookupError(f"journal {journal} has no assigned coordinator")
    client = common.coordinator_client(list(jt.endpoints))
    try:
        result = await asyncio.wait_for(
            client.append(journal, b"", suspend="no-resume", roll_below=below),
            ws.io_timeout * 2)
    finally:
        await client.close()
    return result.end


@app.task(name="workers.jobs_roll.roll_journal", bind=True, ignore_result=True)
def roll_journal(self: Any, journal: str, below: int) -> dict[str, Any]:
    """Close `journal`'s open fragment if it holds bytes below `below` (not retried: the
    next sweeps ask again, after `retry_after`, if the window still waits)."""
    at = time.time()
    with bind(journal=journal, task_id=self.request.id):
        try:
            head = asyncio.run(_roll(journal, below))
        except Exception as exc:  # noqa: BLE001 - recorded: the status note says why
            error = str(exc) or type(exc).__name__
            _record(journal, RollRecord(below=below, at=at, error=error))
            log.warning("closing the open fragment failed", below=below, error=error)
            return {"journal": journal, "error": error}
        _record(journal, RollRecord(below=below, at=at, done=time.time()))
        log.info("open fragment closed for a job window", below=below, head=head)
        return {"journal": journal, "head": head}
