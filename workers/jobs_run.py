"""The run executor (queue `jobs`): `workers.jobs_run.execute(job, window_start, rerun)`.

1. Read the spec and the run; only a PENDING run, or a FAILED one whose backoff has
   passed, starts (anything else: another worker has it, or it is done).
2. Start it with one etcd transaction guarded by the run's mod revision: the run becomes
   RUNNING (attempt n, this worker) and its lease key is written under a fresh etcd lease
   of `QUIRE_WORKER_JOB_LEASE_TTL` seconds, kept alive while the target runs. Two
   executors racing on a run (a re-sent message, two sweeps): one CAS wins.
3. Run the target (workers/jobs_targets.py) with the run's window, offset ranges, the
   spec's args and the run's output identity, bounded by the spec's timeout.
4. Record SUCCEEDED, or FAILED (retried after its backoff by the scheduler) or GAVE_UP,
   and delete the lease key, again under the revision we wrote.

A worker killed mid-run (kill -9) stops refreshing the lease; etcd expires it, the lease
key vanishes, and the next sweep declares the run FAILED and retries it. The run's
output identity is the same for every attempt, so a retry whose first attempt had already
appended is answered with the first attempt's commit (docs/jobs.md, "Output once").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from typing import Any

from protocol.job import JobRun, JobSpec, RunState
from protocol.logs import bind, get_logger
from topology.etcd import connect, delete_op, put_op
from topology.etcd import cmp_version
from topology.jobs import JobNotFound, get_job, get_run, lease_key, update_run
from workers import common, jobs_metrics
from workers.app import app
from workers.jobs_targets import run_target

__all__ = ["execute"]

log = get_logger(__name__)


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def _keep_alive(lease: Any, ttl: int) -> None:
    while True:
        await asyncio.sleep(max(0.5, ttl / 3))
        await lease.refresh()


async def _execute(job: str, window_start: int, rerun: int) -> dict[str, Any]:
    s = common.settings()
    ws = common.worker_settings()
    root = s.etcd_root
    client = await connect(s.etcd_url, timeout=ws.io_timeout)
    try:
        try:
            spec, _ = await get_job(client, root, job)
            entry = await get_run(client, root, job, window_start, rerun)
        except JobNotFound as exc:
            return {"skipped": str(exc)}
        run, now = entry.run, time.time()
        if run.state not in (RunState.PENDING, RunState.FAILED) or run.ranges is None:
            return {"skipped": f"run is {run.state.value}"}
        if run.not_before > now:
            return {"skipped": f"backoff until {run.not_before:.0f}"}
        ttl = ws.job_lease_ttl
        lease = await client.lease(ttl)
        lkey = lease_key(root, job, window_start, rerun)
        worker = _worker_name()
        running = run.start(worker, now)
        rev = await update_run(client, root, running, entry.mod_revision,
                               ops=[put_op(lkey, worker.encode(), lease=lease.id)],
                               compares=[cmp_version(lkey, 0)])
        if rev is None:
            await lease.revoke()
            return {"skipped": "another worker started it"}
        jobs_metrics.JOB_RUNS.labels(job, RunState.RUNNING.value).inc()
        if running.attempt == 1 and rerun == 0 and not run.backfill:
            jobs_metrics.JOB_START_DELAY.labels(job).observe(max(0.0, now - run.window_end))
        log.info("run started", attempt=running.attempt, window_end=run.window_end,
                 delay=round(now - run.window_end, 3))
        return await _run_and_record(client, root, spec, running, rev, lease, ttl, lkey)
    finally:
        await client.close()


async def _run_and_record(client: Any, root: str, spec: JobSpec, run: JobRun, rev: int,
                          lease: Any, ttl: int, lkey: str) -> dict[str, Any]:
    started = time.monotonic()
    keeper = asyncio.create_task(_keep_alive(lease, ttl))
    error = ""
    result: Any = None
    try:
        result = await asyncio.wait_for(asyncio.to_thread(run_target, spec, run), spec.timeout)
    except asyncio.TimeoutError:
        error = f"timed out after {spec.timeout:.0f}s"
    except Exception as exc:  # noqa: BLE001 - any target failure is the run's failure
        error = f"{type(exc).__name__}: {exc}"
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await keeper
    now = time.time()
    done = (run.succeed(now, result) if not error
            else run.fail(now, error, spec.retries, spec.backoff))
    outcome = "success" if not error else "failure"
    jobs_metrics.JOB_RUN_SECONDS.labels(spec.name, outcome).observe(time.monotonic() - started)
    new_rev = await update_run(client, root, done, rev, ops=[delete_op(lkey)])
    with contextlib.suppress(Exception):
        await lease.revoke()
    if new_rev is None:
        # Our lease lapsed (a long pause) and the scheduler already retried the run; its
        # output identity is shared, so nothing was doubled.
        log.warning("run changed under us; our outcome is dropped", outcome=outcome)
        return {"state": "superseded"}
    jobs_metrics.JOB_RUNS.labels(spec.name, done.state.value).inc()
    log.info("run finished", state=done.state.value, attempt=run.attempt, error=error or None)
    return {"state": done.state.value, "attempt": run.attempt, "error": error}


# Our own retry policy (FAILED -> retried by the scheduler) replaces Celery's; a message
# redelivered after a worker's death finds the run RUNNING or FAILED and returns.
@app.task(name="workers.jobs_run.execute", bind=True, ignore_result=True,
          time_limit=8 * 86400, soft_time_limit=8 * 86400 - 60)
def execute(self: Any, job: str, window_start: int, rerun: int = 0) -> dict[str, Any]:
    with bind(job=job, window=window_start, rerun=rerun, task_id=self.request.id):
        return asyncio.run(_execute(job, window_start, rerun))
