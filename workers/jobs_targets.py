"""Running a job's target, and the built-in targets.

A target runs by name, so no role imports another (DESIGN §2):

* `kind: celery` — any Celery task by name. A task this worker has registered runs in
  this process, under the run's lease; any other is sent by name and awaited.
* `kind: spark` — `python -m spark.jobs.<name> --run '<run context JSON>'`, a process in
  the worker's process group (killed past the job's timeout); a non-zero exit fails the
  attempt, and the last line it prints (JSON) is the run's result.
* `kind: dask` — a Python function named `package.module:function`, run the same way by
  the Dask runner, `python -m spark.jobs.dask_run --target <name> --run '<JSON>'`, which
  imports it, calls it with the run context and prints what it returns. The function
  reads the window through the Dask reader and writes through the Dask writer
  (spark/jobs/dask_targets.py: `window_counts`). The worker names both by string only:
  it imports neither spark nor dask.

Every target gets the same keyword arguments (the *run context*): `job`, `window_start`,
`window_end`, `ranges` ({journal: [begin, end)}), `output`, `args`, `rerun`, `attempt`,
`brokers`, `stores` ({journal: its first store URL}), `fallback_stores` ({journal: [its
other stores]}: where the verifying reader finds a good copy of a fragment rotten in the
first, docs/integrity.md), `idempotency_key`
(`job/<job>/<window start>[/rerun-<n>]`, for the Spark and Dask sinks) and `producer`,
`generation`, `history` (for identified appends through quire's client): the same for
every attempt of a run, so a retried attempt's output lands once.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from protocol.job import JobRun, JobSpec
from protocol.logs import get_logger
from workers import common
from workers.app import app
from workers.topology import read_topology_sync

__all__ = ["journal_stores", "run_context", "run_target", "window_counts"]

log = get_logger(__name__)


def journal_stores(topo: Any, journals: Any) -> tuple[dict[str, str], dict[str, list[str]]]:  # noqa: ANN401
    """({journal: first store}, {journal: the other stores}) of `journals` in `topo` (a
    workers.topology.Topology); journals without stores are left out of both."""
    stores: dict[str, str] = {}
    fallbacks: dict[str, list[str]] = {}
    for j in journals:
        jt = topo.journals.get(j)
        if jt is not None and jt.spec.fragment.stores:
            first, *rest = jt.spec.fragment.stores
            stores[j], fallbacks[j] = first, list(rest)
    return stores, fallbacks


def run_context(spec: JobSpec, run: JobRun) -> dict[str, Any]:
    s = common.settings()
    ws = common.worker_settings()
    topo = read_topology_sync(s.etcd_url, s.etcd_root, timeout=ws.io_timeout)
    journals = sorted(run.ranges or {})
    brokers: list[str] = []
    for j in [*journals, spec.output]:
        jt = topo.journals.get(j)
        if jt is not None:
            brokers.extend(ep for ep in jt.endpoints if ep not in brokers)
    stores, fallback_stores = journal_stores(topo, journals)
    if not brokers:  # the journals' members are gone: any member will route us
        brokers = sorted({ep for jt in topo.journals.values() for ep in jt.endpoints})
    producer, generation, history = run.identity()
    return {
        "job": spec.name, "window_start": run.window_start, "window_end": run.window_end,
        "ranges": {j: list(r) for j, r in sorted((run.ranges or {}).items())},
        "output": spec.output, "args": dict(spec.args), "rerun": run.rerun,
        "attempt": run.attempt, "brokers": brokers, "stores": stores,
        "fallback_stores": fallback_stores,
        "idempotency_key": run.idempotency_key,
        "producer": producer, "generation": generation, "history": history,
    }


def run_target(spec: JobSpec, run: JobRun) -> Any:
    ctx = run_context(spec, run)
    if spec.target.kind == "spark":
        return _run_process(spec, ctx, f"spark.jobs.{spec.target.name}")
    if spec.target.kind == "dask":
        return _run_process(spec, ctx, "spark.jobs.dask_run", "--target", spec.target.name)
    task = app.tasks.get(spec.target.name)
    if task is not None:
        return task(**ctx)
    result = app.send_task(spec.target.name, kwargs=ctx)
    return result.get(timeout=spec.timeout, disable_sync_subtasks=False)


def _run_process(spec: JobSpec, ctx: dict[str, Any], module: str, *extra: str) -> Any:
    # In the worker's process group (not a session of its own): whatever stops the worker's
    # group stops the target too. Past the timeout the driver is killed; its JVM (PySpark's
    # gateway) exits when the driver's pipe closes.
    proc = subprocess.Popen([sys.executable, "-m", module, *extra, "--run", json.dumps(ctx)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    what = spec.target.name if spec.target.kind == "dask" else module
    try:
        out, err = proc.communicate(timeout=spec.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"{what} ran past the job's timeout ({spec.timeout:g}s)") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        tail = (err or out).strip().splitlines()[-5:]
        raise RuntimeError(f"{what} exited {proc.returncode}: " + " | ".join(tail))
    last = (out.strip().splitlines() or ["{}"])[-1]
    try:
        return json.loads(last)
    except ValueError:
        return {"stdout": last[:500]}


# -- built-in targets ------------------------------------------------------------------

async def _read_range(client: Any, journal: str, begin: int, end: int) -> bytes:
    if end <= begin:
        return b""
    parts: list[bytes] = []
    async for offset, chunk in client.read(journal, begin, end_offset=end):
        if offset >= end:
            break
        parts.append(bytes(chunk[: max(0, end - offset)]))
        if offset + len(chunk) >= end:
            break
    return b"".join(parts)


async def _ensure_output(client: Any, output: str, store: str) -> None:
    from protocol import FragmentSpec, JournalSpec
    from protocol.errors import StatusError

    try:
        await client.get_journal(output)
        return
    except StatusError:
        pass
    await client.apply([JournalSpec(name=output, replication=1,
                                    fragment=FragmentSpec(stores=(store,) if store else ()))])


async def _window_counts(ctx: dict[str, Any]) -> dict[str, Any]:
    from quire.client import Client, TxnId

    args = ctx.get("args") or {}
    field = str(args.get("field", ""))
    s = common.settings()
    from protocol.credentials import settings_token
    from protocol.tls import settings_client_ssl

    async with Client(ctx["brokers"], retry_timeout=60, token=settings_token(s),
                      ssl=settings_client_ssl(s)) as client:
        lines: list[dict[str, Any]] = []
        total = 0
        for journal, (begin, end) in sorted(ctx["ranges"].items()):
            data = await _read_range(client, journal, begin, end)
            counts: dict[str, int] = {}
            for line in data.splitlines():
                if not line.strip():
                    continue
                key = ""
                if field:
                    try:
                        key = str(json.loads(line).get(field, ""))
                    except (ValueError, AttributeError):
                        key = ""
                counts[key] = counts.get(key, 0) + 1
            for key, n in sorted(counts.items()):
                row = {"job": ctx["job"], "window_start": ctx["window_start"],
                       "window_end": ctx["window_end"], "journal": journal, "messages": n}
                if field:
                    row[field] = key
                lines.append(row)
                total += n
        if float(args.get("hold_before", 0)):
            time.sleep(float(args["hold_before"]))
        out = ctx.get("output")
        if out and lines:
            stores = ctx.get("stores") or {}
            await _ensure_output(client, out, next(iter(stores.values()), ""))
            body = b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in lines)
            txn = TxnId(ctx["producer"], ctx["generation"], ctx["history"], 1)
            r = await client.append(out, body, txn=txn)
            log.info("window counted", rows=len(lines), messages=total, output=out,
                     begin=r.begin, end=r.end)
    if float(args.get("hold_after", 0)):
        # Tests and demos: a window whose output is written but whose run is not yet
        # recorded (kill the worker now: the retry's append is answered, not re-written).
        time.sleep(float(args["hold_after"]))
    return {"rows": len(lines), "messages": total}


@app.task(name="workers.jobs_targets.window_counts", ignore_result=False)
def window_counts(**ctx: Any) -> dict[str, Any]:
    """Count a window's messages per journal (and per `args.field` of JSON messages) and
    append one JSON line per count to the output journal, as one identified append."""
    return asyncio.run(_window_counts(ctx))
