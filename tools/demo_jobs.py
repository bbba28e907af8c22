"""The demo's jobs step (docs/jobs.md): a job over the demo's journals, run once per window
by the local cluster's workers (they consume the `jobs` queue) as soon as the window is
persisted.

`apply_job` runs just before the demo appends, with the job's start at that moment, so
its first window holds the demo's messages; that window completes while the Spark and
consumer steps run (the journals' last fragments are closed by their `flush_interval`
once appends stop). `show_runs` ends the demo: it waits (bounded) until the first
window's run succeeded and the runs have counted every message the demo appended, then
prints the runs as `quire jobs runs` does (the middle of a long list elided).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import yaml

from protocol.job import JobRun, RunState
from tools.lifetime import dying_with_us
from tools.output import make_console

console = make_console()

JOB = "demo/counts-per-10s"
OUTPUT = "demo/job-counts"
SELECTOR = "topic=events"
RUN_WAIT = 90.0
"""Bound on the wait for the first window at the end of the demo (its last fragment is
closed by the journals' 60 s flush interval, which the Spark steps usually outlast)."""


def _quire() -> list[str]:
    return [sys.executable, "-m", "tools.cli.main"]


def _cli(etcd_url: str, root: str, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(dying_with_us([*_quire(), *args, "--etcd", etcd_url, "--root", root]),
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "160"})  # one line per run


def spec() -> dict[str, object]:
    return {"name": JOB, "selector": SELECTOR, "window": "10s",
            "target": {"kind": "celery", "name": "workers.jobs_targets.window_counts"},
            "args": {"field": "key"}, "output": OUTPUT, "retries": 3, "backoff": "2s"}


async def apply_job(etcd_url: str, root: str, data_dir: Path) -> None:
    """Write the spec file and apply it as `quire jobs apply -f` does, in-process (a CLI
    process takes seconds to start on a loaded machine: windows would pass meanwhile),
    starting at the window holding now."""
    import msgspec

    from protocol.job import window_of
    from tools.cli.jobs import parse
    from topology.etcd import connect
    from topology.jobs import apply_job as put_job

    path = data_dir / "job-counts.yaml"
    path.write_text(yaml.safe_dump(spec(), sort_keys=False))
    (job,) = parse(path.read_text(), str(path))
    job = msgspec.structs.replace(job, start=float(window_of(time.time(), job.window)))
    client = await connect(etcd_url)
    try:
        rev = await put_job(client, root, job)
    finally:
        await client.close()
    console.print(f"applied job [bold]{JOB}[/] ({path.name}: every 10 s window of {SELECTOR}, "
                  f"counts per key to {OUTPUT}) at etcd revision {rev}")


def _runs(etcd_url: str, root: str) -> list[JobRun]:
    from topology.etcd import connect
    from topology.jobs import list_runs

    async def body() -> list[JobRun]:
        client = await connect(etcd_url)
        try:
            return [e.run for e in await list_runs(client, root, JOB)]
        finally:
            await client.close()

    return asyncio.run(body())


def first_window_succeeded(runs: list[JobRun]) -> bool:
    first = min(runs, key=lambda r: (r.window_start, r.rerun), default=None)
    return first is not None and first.state == RunState.SUCCEEDED


def counted(runs: list[JobRun]) -> tuple[int, int]:
    """(messages, rows) the job's succeeded runs counted (the built-in target's result)."""
    messages = rows = 0
    for run in runs:
        if run.state == RunState.SUCCEEDED and isinstance(run.result, dict):
            messages += int(run.result.get("messages", 0))
            rows += int(run.result.get("rows", 0))
    return messages, rows


def show_runs(etcd_url: str, root: str, messages: int) -> int:
    """Wait (at most RUN_WAIT s) until the job's first window succeeded and its runs have
    counted the demo's `messages` (the appends may straddle a window's end); print the
    runs as `quire jobs runs` does."""
    console.print(f"waiting for the windows of {JOB} holding the demo's messages (each runs "
                  "once every journal is persisted past its end)")
    started = time.monotonic()
    deadline = started + RUN_WAIT
    runs: list[JobRun] = []
    done = False
    while time.monotonic() < deadline:
        try:
            runs = _runs(etcd_url, root)
        except Exception:  # noqa: BLE001 - etcd busy: asked again until the deadline
            runs = []
        done = first_window_succeeded(runs) and counted(runs)[0] >= messages
        if done:
            break
        time.sleep(1.0)
    proc = _cli(etcd_url, root, "jobs", "runs", JOB, "--limit", "0")
    console.print(f"quire jobs runs {JOB}", highlight=False)
    for line in elide(proc.stdout.rstrip().splitlines()):
        console.print(f"  {line}", highlight=False, markup=False)
    total, rows = counted(runs)
    if not done:
        states = ", ".join(f"{r.window_start}:{r.state.value}" for r in runs[:5]) or "no runs"
        console.print(f"[red]{JOB} counted {total} of {messages} messages within "
                      f"{RUN_WAIT:.0f}s (first runs: {states})[/]")
        return 1
    console.print(f"first window of {JOB}: succeeded; {total} messages counted into {rows} "
                  f"rows of {OUTPUT} (waited {time.monotonic() - started:.1f}s at the end "
                  "of the demo)")
    return 0


def elide(lines: list[str], head: int = 3, tail: int = 2) -> list[str]:
    """A `quire jobs runs` table with only its first `head` and last `tail` runs (header,
    footer and the `next:` line kept)."""
    rows = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("│")]
    if len(rows) <= head + tail + 1:
        return lines
    cut = rows[head:len(rows) - tail]
    return [*lines[:cut[0]], f"  … {len(cut)} more windows …", *lines[cut[-1] + 1:]]
