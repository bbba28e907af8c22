"""What one scheduler sweep should do for one job — pure: no etcd, Redis or clock.

Given the spec, its runs, the watermarks of its journals, which runs hold a live lease,
and which were dispatched lately, `plan` returns the windows to create, the runs to
declare lost (running, but their lease is gone: the worker died), the runs to dispatch
(due, within the job's concurrency) and the status note (`waiting_on`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.job import JobRun, JobSpec, RunState

__all__ = ["Plan", "plan"]

MAX_NEW_PER_SWEEP = 200
"""Bounds one sweep's work after a long outage; the next sweep continues."""


@dataclass
class Plan:
    create: list[int] = field(default_factory=list)
    """Window starts to create runs for (in order)."""
    lost: list[JobRun] = field(default_factory=list)
    dispatch: list[JobRun] = field(default_factory=list)
    need_ranges: list[JobRun] = field(default_factory=list)
    """Runs without offset ranges (backfilled) whose window is now complete."""
    next_window: int = 0
    waiting_on: str = ""
    watermark: float = 0.0


def low_watermark(watermarks: dict[str, float]) -> tuple[str, float]:
    """(journal, watermark) of the journal furthest behind; ("", 0) with no journals."""
    if not watermarks:
        return "", 0.0
    journal = min(sorted(watermarks), key=lambda j: watermarks[j])
    return journal, watermarks[journal]


def plan(spec: JobSpec, runs: list[JobRun], watermarks: dict[str, float], *,
         leased: set[tuple[int, int]], dispatched: set[tuple[int, int]], now: float) -> Plan:
    """`leased` / `dispatched`: (window_start, rerun) of runs holding a lease / whose
    dispatch is recent enough not to repeat."""
    out = Plan()
    waiting_on, low = low_watermark(watermarks)
    out.waiting_on, out.watermark = waiting_on, low
    complete_until = low - spec.delay if watermarks else float("-inf")

    firsts = [r.window_start for r in runs if r.rerun == 0 and not r.backfill]
    nxt = max(spec.first_window(), max(firsts, default=-1) + spec.window)
    while (nxt + spec.window <= complete_until and len(out.create) < MAX_NEW_PER_SWEEP
           and not spec.suspend):
        out.create.append(nxt)
        nxt += spec.window
    out.next_window = nxt

    busy = 0
    due: list[JobRun] = []
    for run in runs:
        key = (run.window_start, run.rerun)
        if run.state == RunState.RUNNING:
            if key in leased:
                busy += 1
            else:
                out.lost.append(run)
        elif run.state in (RunState.PENDING, RunState.FAILED):
            if run.ranges is None:
                if run.window_end <= complete_until:
                    out.need_ranges.append(run)
                continue
            if key in dispatched:
                busy += 1
            elif run.not_before <= now:
                due.append(run)
    if not spec.suspend:
        room = max(0, spec.max_concurrent - busy)
        out.dispatch = sorted(due, key=lambda r: (r.window_start, r.rerun))[:room]
    return out
