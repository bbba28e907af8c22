"""The job scheduler (queue `jobs`): beat runs `workers.jobs.sweep` every
`QUIRE_WORKER_JOBS_INTERVAL` seconds.

One sweep, for every job spec in etcd (topology/jobs.py):

1. the journals its selector matches, and their persisted watermarks
   (workers/watermark.py);
2. `jobs_plan.plan` (pure) decides: windows complete (lowest watermark - delay past their
   end) that have no run yet, runs whose worker died (running, lease gone), runs due
   for dispatch within the job's `max_concurrent`;
3. each new run is created with an etcd compare-and-set on its key — whatever the number
   of beats, sweeps and workers, one run per window — carrying the window's offset
   range in each journal, fixed once so every attempt reads the same rows;
4. lost runs become FAILED (attempt n) or GAVE_UP by a CAS on their revision; due runs
   are sent to `workers.jobs_run.execute`; the status note (next window, the journal
   holding it back and why) is written when it changes;
5. a journal whose open fragment holds the next window's last bytes past the window's
   end is asked to close it (workers/jobs_roll.py), so every window completes without
   a `flush_interval` in the journal's spec.

Several sweeps may overlap (two beats, a slow sweep): a Redis lock skips the duplicate,
and every write is a CAS anyway, so a lost race only costs a retry next sweep.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol.job import JobRun, JobSpec, RunState
from protocol.labels import parse_selector
from protocol.logs import bind, get_logger
from topology.etcd import connect
from topology.jobs import (
    JobStatus,
    create_run,
    get_status,
    leases_prefix,
    list_jobs,
    list_runs,
    put_status,
    update_run,
)
from workers import common, jobs_metrics, jobs_roll, watermark
from workers.app import app
from workers.errors import MAINTENANCE_RETRY
from workers.jobs_plan import plan
from workers.topology import read_topology

__all__ = ["DISPATCHED_KEY", "dispatch", "sweep"]

log = get_logger(__name__)

DISPATCHED_KEY = "quire:jobs:dispatched"
"""Hash `<job>#<window>#<rerun>` -> unix time of the last dispatch: a run waiting in the
queue is not sent again until `_REDISPATCH` has passed (duplicates would be harmless —
the executor's CAS lets one start — but cost a message each)."""


def _redispatch_after() -> float:
    return max(30.0, 6 * common.worker_settings().jobs_interval)


def _dkey(run: JobRun) -> str:
    return f"{run.job}#{run.window_start}#{run.rerun}"


def dispatch(run: JobRun, now: float) -> None:
    from workers.jobs_run import execute

    execute.apply_async(args=[run.job, run.window_start, run.rerun], queue="jobs")
    common.redis_client().hset(DISPATCHED_KEY, _dkey(run), f"{now:.3f}")


def _recently_sent(run: JobRun, sent: float, now: float) -> bool:
    """Dispatched since the run last changed (created, or its last attempt ended), and
    not so long ago that the message may have been lost."""
    changed = max([run.created, *(a.finished for a in run.attempts)])
    return sent >= changed and now - sent < _redispatch_after()


def ranges_for(journals: list[str], begin: float, end: float) -> dict[str, tuple[int, int]] | None:
    out: dict[str, tuple[int, int]] = {}
    for j in journals:
        b, e = watermark.boundary(j, begin), watermark.boundary(j, end)
        if b is None or e is None:
            return None
        out[j] = (b, max(b, e))
    return out


async def _sweep_job(client: Any, root: str, spec: JobSpec, journals: list[str],
                     leases: set[str], dispatched: dict[str, float], now: float) -> dict[str, int]:
    wms = watermark.read_watermarks(journals)
    entries = await list_runs(client, root, spec.name)
    by_key = {(e.run.window_start, e.run.rerun): e for e in entries}
    leased = {(e.run.window_start, e.run.rerun) for e in entries
              if e.key.replace("/jobs/runs/", "/jobs/leases/", 1) in leases}
    recent = {(e.run.window_start, e.run.rerun) for e in entries
              if _recently_sent(e.run, dispatched.get(_dkey(e.run), 0.0), now)}
    p = plan(spec, [e.run for e in entries], wms, leased=leased, dispatched=recent, now=now)
    if wms and p.watermark:
        jobs_metrics.JOB_WATERMARK_LAG.labels(spec.name).set(max(0.0, now - p.watermark))
    created = 0
    for start in p.create:
        run = JobRun(job=spec.name, window_start=start, window_end=start + spec.window,
                     created=now, ranges=ranges_for(journals, start, start + spec.window))
        if await create_run(client, root, run):
            created += 1
            jobs_metrics.JOB_RUNS.labels(spec.name, RunState.PENDING.value).inc()
            if len(p.dispatch) < spec.max_concurrent and run.ranges is not None:
                p.dispatch.append(run)
    for run in p.need_ranges:
        ranges = ranges_for(journals, run.window_start, run.window_end)
        entry = by_key[(run.window_start, run.rerun)]
        if ranges is not None:
            import msgspec

            await update_run(client, root, msgspec.structs.replace(run, ranges=ranges),
                             entry.mod_revision)
    for run in p.lost:
        entry = by_key[(run.window_start, run.rerun)]
        failed = run.fail(now, "worker lost: its run lease expired", spec.retries, spec.backoff)
        if await update_run(client, root, failed, entry.mod_revision) is not None:
            jobs_metrics.JOB_RUNS.labels(spec.name, failed.state.value).inc()
            log.warning("run lost with its worker", job=spec.name, window=run.window_start,
                        attempt=run.attempt, state=failed.state.value)
    sent = 0
    for run in p.dispatch[:spec.max_concurrent]:
        dispatch(run, now)
        sent += 1
    needed = p.next_window + spec.window + spec.delay
    lagging = sorted((j for j in journals if wms.get(j, 0.0) < needed),
                     key=lambda j: (wms.get(j, 0.0), j))
    reason = "" if spec.suspend else jobs_roll.waits(lagging, needed, now)
    status = JobStatus(next_window=p.next_window, waiting_on=p.waiting_on if journals else "",
                       watermark=p.watermark, journals=len(journals),
                       note="" if journals else f"selector {spec.selector!r} matches no journal",
                       reason=reason)
    if await get_status(client, root, spec.name) != status:
        await put_status(client, root, spec.name, status)
    return {"created": created, "lost": len(p.lost), "dispatched": sent}


async def _sweep() -> dict[str, Any]:
    s = common.settings()
    ws = common.worker_settings()
    client = await connect(s.etcd_url, timeout=ws.io_timeout)
    try:
        jobs = await list_jobs(client, s.etcd_root)
        if not jobs:
            return {}  # (no job: the specs of every journal are not worth a read)
        # The specs alone: names and labels pick each job's journals (a roll reads its
        # own journal's endpoints, jobs_roll.py) — not the members and assignments,
        # 3 keys of 4 at R=3, every jobs_interval (40,000 keys at 10,000 journals).
        topo = await read_topology(s.etcd_url, s.etcd_root, timeout=ws.io_timeout,
                                   endpoints=False)
        leases = {kv.key.decode() for kv in
                  (await client.get_prefix(leases_prefix(s.etcd_root).encode())).kvs}
        dispatched = {k.decode(): float(v) for k, v in
                      common.redis_client().hgetall(DISPATCHED_KEY).items()}
        now = time.time()
        out: dict[str, Any] = {}
        for spec, _ in jobs:
            selector = parse_selector(spec.selector)
            journals = sorted(n for n, jt in topo.journals.items()
                              if selector.matches_journal(n, jt.spec.labels))
            with bind(job=spec.name):
                out[spec.name] = await _sweep_job(client, s.etcd_root, spec, journals, leases,
                                                  dispatched, now)
        stale = [k for k, t in dispatched.items() if now - t > 10 * _redispatch_after()]
        if stale:
            common.redis_client().hdel(DISPATCHED_KEY, *stale)
        return out
    finally:
        await client.close()


@app.task(name="workers.jobs.sweep", bind=True, ignore_result=True, **MAINTENANCE_RETRY)
def sweep(self: Any) -> dict[str, Any]:
    ws = common.worker_settings()
    with common.sweep_lock("jobs", ttl=max(5.0, ws.jobs_interval)) as held:
        if not held:
            log.debug("another jobs sweep is running; skipping")
            return {}
        out = asyncio.run(_sweep())
        if any(v.get("created") or v.get("lost") or v.get("dispatched") for v in out.values()):
            log.info("jobs sweep", **{k: v for k, v in out.items()})
        return out
