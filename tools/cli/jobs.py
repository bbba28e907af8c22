"""`quire jobs apply|list|get|delete|runs|backfill|rerun`: batch jobs run once per window.

Job specs and runs live in etcd (topology/jobs.py), so these commands talk to etcd
directly (`--etcd`, default $QUIRE_ETCD_URL). The workers' scheduler (workers/jobs.py)
creates and executes the runs; `backfill` and `rerun` only create runs, which the
scheduler then executes within the job's `max_concurrent`. Spec file format:

    name: counts/per-10s
    selector: "topic=events"
    window: 10s
    target: {kind: celery, name: workers.jobs_targets.window_counts}
    args: {field: key}
    output: demo/job-counts
    retries: 3
    backoff: 2s
    delay: 0s
    start: "2026-11-26T14:00:00Z"   # default: now (an existing job keeps its start)

A file may hold one spec, a list, `{jobs: [...]}` or several YAML documents. See
docs/jobs.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import typer
import yaml

from protocol.errors import ValidationError
from protocol.job import JobRun, JobSpec, RunState, iso, parse_time, window_of
from topology.jobs import (
    JobNotFound,
    JobStatus,
    apply_jobs,
    check_window,
    create_run,
    delete_job,
    get_job,
    get_run,
    get_status,
    list_jobs,
    list_runs,
)

from .common import EXIT_NOT_FOUND, CliError, MaxTxnSizeOption, Output, OutputOption, \
    emit_json_lines, emit_table, emit_yaml, stdout
from .shards import EtcdOption, RootOption, _root, _run, applied_line

app = typer.Typer(help="Batch jobs over journals, run once per window when it is persisted.",
                  no_args_is_help=True)

MAX_BACKFILL = 10_000


def parse(text: str, source: str = "jobs") -> list[JobSpec]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValidationError(source, f"not valid YAML: {' '.join(str(exc).split())}") from None
    specs: list[JobSpec] = []
    for d, doc in enumerate(docs):
        where = f"{source}[{d}]" if len(docs) > 1 else source
        if isinstance(doc, dict) and "jobs" in doc:
            items, where = doc["jobs"], f"{where}.jobs"
        elif isinstance(doc, list):
            items = doc
        else:
            items = [doc]
        if not isinstance(items, list):
            raise ValidationError(where, "expected a list of jobs")
        for i, item in enumerate(items):
            path = f"{where}[{i}]" if len(items) > 1 or isinstance(doc, list) or "[" in where \
                else where
            specs.append(JobSpec.from_obj(item, path))
    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise ValidationError(source, f"job {name!r} appears twice")
    return specs


def _not_found(exc: JobNotFound) -> CliError:
    return CliError(str(exc), EXIT_NOT_FOUND)


def _window_arg(text: str, spec: JobSpec, what: str) -> int:
    t = parse_time(text, what)
    if t % spec.window:
        raise ValidationError(what, f"{text!r} is not the start of a {spec.window}s window")
    return int(t)


@app.command("apply")
def apply_cmd(file: Path = typer.Option(..., "-f", "--file", help="Job spec YAML ('-' = stdin)."),
              dry_run: bool = typer.Option(False, "--dry-run", help="Validate only."),
              max_txn_size: int = MaxTxnSizeOption,
              etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Create or replace jobs from a spec file: unchanged specs are skipped, the rest
    written in transactions of at most --max-txn-size changes."""
    text = typer.get_text_stream("stdin").read() if str(file) == "-" else file.read_text()
    specs = parse(text, str(file))
    if dry_run:
        stdout.print(f"{len(specs)} job spec(s) valid")
        return
    r = _root(root)

    async def body(client: Any) -> Any:
        stored = {spec.name: spec for spec, _ in await list_jobs(client, r)}
        resolved = []
        for spec in specs:
            if not spec.start:
                old = stored.get(spec.name)
                start = old.start if old is not None else time.time()
                spec = msgspec.structs.replace(spec, start=float(window_of(start, spec.window)))
            resolved.append(spec)
        return await apply_jobs(client, r, resolved, max_txn_size=max_txn_size)

    stdout.print(applied_line(_run(etcd, body), "job"))


def _counts(runs: list[JobRun]) -> str:
    by: dict[str, int] = {}
    for run in runs:
        by[run.state.value] = by.get(run.state.value, 0) + 1
    return " ".join(f"{k}:{v}" for k, v in sorted(by.items())) or "-"


def _waiting(status: JobStatus | None, now: float) -> str:
    if status is None:
        return "- (no sweep yet)"
    if status.note:
        return status.note
    behind = f", {now - status.watermark:.0f}s behind" if status.watermark else ", no watermark yet"
    return (f"window {iso(status.next_window)} waits on {status.waiting_on}"
            f" (watermark {iso(status.watermark) if status.watermark else '-'}{behind})"
            + (f" — {status.reason}" if status.reason else ""))


@app.command("list")
def list_cmd(etcd: str = EtcdOption, root: str = RootOption, output: Output = OutputOption) -> None:
    """Every job: its window, target, runs by state and what its next window waits on."""
    r = _root(root)

    async def body(client: Any) -> list[tuple[JobSpec, int, list[JobRun], JobStatus | None]]:
        out = []
        for spec, rev in await list_jobs(client, r):
            runs = [e.run for e in await list_runs(client, r, spec.name)]
            out.append((spec, rev, runs, await get_status(client, r, spec.name)))
        return out

    rows = _run(etcd, body)
    now = time.time()
    if output is Output.yaml:
        emit_yaml({"jobs": [spec.to_obj() for spec, *_ in rows]})
    elif output is Output.json:
        emit_json_lines({"spec": spec.to_obj(), "revision": rev, "runs": _counts(runs),
                         "status": status} for spec, rev, runs, status in rows)
    else:
        emit_table(None, ["job", "selector", "window", "target", "output", "runs", "next"],
                   [(spec.name, spec.selector, spec.to_obj()["window"],
                     f"{spec.target.kind}:{spec.target.name}", spec.output or "-", _counts(runs),
                     _waiting(status, now)) for spec, rev, runs, status in rows])


@app.command("get")
def get_cmd(job: str = typer.Argument(..., metavar="JOB"), etcd: str = EtcdOption,
            root: str = RootOption) -> None:
    """One job's spec, in the form `apply` reads."""
    try:
        spec, _ = _run(etcd, lambda c: get_job(c, _root(root), job))
    except JobNotFound as exc:
        raise _not_found(exc) from None
    emit_yaml(spec.to_obj())


@app.command("delete")
def delete_cmd(job: str = typer.Argument(..., metavar="JOB"),
               keep_runs: bool = typer.Option(False, "--keep-runs", help="Keep its run records."),
               etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Delete a job (and its runs); a run executing now finishes, unrecorded."""
    try:
        rev = _run(etcd, lambda c: delete_job(c, _root(root), job, runs=not keep_runs))
    except JobNotFound as exc:
        raise _not_found(exc) from None
    stdout.print(f"deleted job {job} at revision {rev}")


def _attempt_line(run: JobRun) -> tuple[str, str, str]:
    if not run.attempts:
        return "-", "-", ""
    last = run.attempts[-1]
    took = f"{last.finished - last.started:.1f}s" if last.finished else "running"
    return iso(last.started), took, last.error


@app.command("runs")
def runs_cmd(job: str = typer.Argument(..., metavar="JOB"),
             limit: int = typer.Option(20, "--limit", help="Newest N windows (0 = all)."),
             etcd: str = EtcdOption, root: str = RootOption, output: Output = OutputOption) -> None:
    """A job's runs, newest last, and the journal its next window waits on."""
    r = _root(root)

    async def body(client: Any) -> tuple[list[JobRun], JobStatus | None]:
        await get_job(client, r, job)
        return [e.run for e in await list_runs(client, r, job)], await get_status(client, r, job)

    try:
        runs, status = _run(etcd, body)
    except JobNotFound as exc:
        raise _not_found(exc) from None
    shown = runs[-limit:] if limit else runs
    if output is Output.json:
        emit_json_lines([*({"run": run} for run in shown), {"status": status}])
        return
    if output is Output.yaml:
        emit_yaml({"runs": [msgspec.to_builtins(run) for run in shown],
                   "status": msgspec.to_builtins(status) if status else None})
        return
    rows = []
    for run in shown:
        started, took, error = _attempt_line(run)
        state = run.state.value
        if run.state == RunState.FAILED:
            state += f" (attempt {run.attempt}; retry at {iso(run.not_before)})"
        elif run.attempt > 1 or run.state == RunState.GAVE_UP:
            state += f" (attempt {run.attempt})"
        rows.append((iso(run.window_start), iso(run.window_end),
                     state + (f" rerun {run.rerun}" if run.rerun else "")
                     + (" backfill" if run.backfill else ""),
                     started, took, run.worker or "-", error or "-"))
    emit_table(None, ["window", "end", "state", "started", "took", "worker", "error"], rows)
    stdout.print(f"next: {_waiting(status, time.time())}")


@app.command("backfill")
def backfill_cmd(job: str = typer.Argument(..., metavar="JOB"),
                 start: str = typer.Option(..., "--from", help="First window's start (ISO-8601 "
                                                               "or unix seconds)."),
                 end: str = typer.Option(..., "--to", help="End (exclusive) of the last window."),
                 etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Create runs for past windows [--from, --to); the scheduler executes them, at most
    the job's max_concurrent at a time. Windows that already have a run are skipped."""
    r = _root(root)

    async def body(client: Any) -> tuple[int, int]:
        spec, _ = await get_job(client, r, job)
        first, last = _window_arg(start, spec, "--from"), _window_arg(end, spec, "--to")
        if last <= first:
            raise ValidationError("--to", "must be after --from")
        n = (last - first) // spec.window
        if n > MAX_BACKFILL:
            raise ValidationError("--from", f"{n} windows; at most {MAX_BACKFILL} at once")
        created = 0
        now = time.time()
        for w in range(first, last, spec.window):
            run = JobRun(job=job, window_start=w, window_end=w + spec.window, created=now,
                         backfill=True)
            created += await create_run(client, r, run)
        return created, n

    try:
        created, n = _run(etcd, body)
    except JobNotFound as exc:
        raise _not_found(exc) from None
    stdout.print(f"created {created} run(s) for {n} window(s) of {job}"
                 + (f" ({n - created} already had one)" if n - created else ""))


@app.command("rerun")
def rerun_cmd(job: str = typer.Argument(..., metavar="JOB"),
              window: str = typer.Argument(..., help="The window's start (ISO-8601 or unix s)."),
              etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Run one window again. Its output replaces nothing: it is appended under the rerun's
    own identifiers (docs/jobs.md)."""
    r = _root(root)

    async def body(client: Any) -> int:
        spec, _ = await get_job(client, r, job)
        w = _window_arg(window, spec, "WINDOW")
        check_window(spec, w)
        entries = [e for e in await list_runs(client, r, job) if e.run.window_start == w]
        if not entries:
            await get_run(client, r, job, w)  # raises JobNotFound naming the window
        last = max(entries, key=lambda e: e.run.rerun).run
        if not last.final:
            raise CliError(f"window {iso(w)} of {job} is {last.state.value}; "
                           "rerun it once it has finished", 4)
        again = last.rerun_of(time.time())
        if not await create_run(client, r, again):
            raise CliError(f"rerun {again.rerun} of window {iso(w)} exists already", 4)
        return again.rerun

    try:
        n = _run(etcd, body)
    except JobNotFound as exc:
        raise _not_found(exc) from None
    stdout.print(f"created rerun {n} of window {window} of {job}")
