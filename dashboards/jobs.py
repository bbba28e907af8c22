"""Jobs for the live page (docs/jobs.md): specs, their last runs and states, and what the
next window waits on — decoded from the same etcd range read as the rest of the topology
(topology/jobs.py layout). Each journal's persisted watermark is read from the workers'
Redis (`quire:watermarks`, written by workers/watermark.py) by dashboards/state.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from protocol.job import JobRun, JobSpec, RunState
from topology.jobs import JobStatus, runs_prefix, specs_prefix, status_key

__all__ = ["LAST_RUNS", "job_rows", "journals_of"]

LAST_RUNS = 5
"""Newest runs shown per job (counts by state cover all of them)."""

_SPEC = msgspec.json.Decoder(JobSpec)
_RUN = msgspec.json.Decoder(JobRun)
_STATUS = msgspec.json.Decoder(JobStatus)


def _run_row(run: JobRun) -> dict[str, Any]:
    last = run.attempts[-1] if run.attempts else None
    return {
        "window_start": run.window_start, "window_end": run.window_end,
        "state": run.state.value, "attempt": run.attempt, "rerun": run.rerun,
        "backfill": run.backfill, "worker": run.worker,
        "started": last.started if last else None,
        "took": (last.finished - last.started) if last and last.finished else None,
        "error": last.error if last else "",
        "retry_at": run.not_before if run.state == RunState.FAILED else None,
        "journals": sorted(run.ranges or {}),
    }


def job_rows(root: str, kvs: Iterable[tuple[bytes, bytes]],
             watermarks: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per decodable job spec: its spec summary, run counts by state, its newest
    LAST_RUNS runs (oldest first) and the scheduler's last status. With `watermarks`
    (journal -> persisted watermark), `status.watermark_now` is the lowest of the
    journals the job's newest run read (what holds its next window back now)."""
    specs: dict[str, JobSpec] = {}
    runs: dict[str, list[JobRun]] = {}
    statuses: dict[str, JobStatus] = {}
    sp, rp = specs_prefix(root), runs_prefix(root)
    tp = status_key(root, "")
    for raw_key, value in kvs:
        key = raw_key.decode(errors="replace")
        try:
            if key.startswith(sp):
                spec = _SPEC.decode(value)
                if spec.name == key[len(sp):]:
                    specs[spec.name] = spec
            elif key.startswith(rp):
                run = _RUN.decode(value)
                runs.setdefault(run.job, []).append(run)
            elif key.startswith(tp):
                statuses[key[len(tp):]] = _STATUS.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    rows = []
    for name in sorted(specs):
        spec = specs[name]
        mine = sorted(runs.get(name, []), key=lambda r: (r.window_start, r.rerun))
        counts: dict[str, int] = {}
        for run in mine:
            counts[run.state.value] = counts.get(run.state.value, 0) + 1
        status = statuses.get(name)
        shown = [_run_row(r) for r in mine[-LAST_RUNS:]]
        read = shown[-1]["journals"] if shown else []
        status_out = msgspec.to_builtins(status) if status is not None else None
        if status_out is not None:
            # The scheduler's reason names every journal short of the window, not only
            # those `journals_of` lists for a scoped token: `quire jobs runs` shows it.
            status_out.pop("reason", None)
        if status_out is not None and watermarks is not None and read:
            status_out["watermark_now"] = min(watermarks.get(j, 0.0) for j in read)
        rows.append({
            "name": name,
            "selector": spec.selector,
            "window": spec.to_obj()["window"],
            "target": f"{spec.target.kind}:{spec.target.name}",
            "output": spec.output,
            "suspend": spec.suspend,
            "counts": counts,
            "last_state": mine[-1].state.value if mine else None,
            "runs": shown,
            "status": status_out,
        })
    return rows


def journals_of(job: dict[str, Any]) -> list[str]:
    """Every journal a job row names (its output, the journals its runs read, the one
    its next window waits on): what a scoped token must cover to see the row."""
    names = {j for run in job.get("runs", []) for j in run.get("journals", [])}
    if job.get("output"):
        names.add(job["output"])
    waiting = (job.get("status") or {}).get("waiting_on")
    if waiting:
        names.add(waiting)
    return sorted(names)
