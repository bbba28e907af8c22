"""Job keys in etcd: specs, runs (one per window, created by compare-and-set), run leases,
and the scheduler's status notes.

Key layout (beside the journal and shard keys; job names never contain '#'):

    <root>/jobs/specs/<job>                     JobSpec JSON, no lease
    <root>/jobs/runs/<job>#<window start>       JobRun JSON, no lease; the window start is
                                                12 zero-padded digits so keys sort by time
    <root>/jobs/leases/<job>#<window start>     "<worker>": the run is executing, under the
                                                executing worker's etcd lease (it vanishes
                                                when that worker dies)
    <root>/jobs/status/<job>                    JobStatus JSON: the next window and the
                                                journal holding it back, no lease

A run is created only if its key does not exist (`create_run`), so however many beats
and workers race on a window, one run exists per (job, window, rerun); every later change
is guarded by the run's mod revision (`update_run`). The CLI (`quire jobs …`) and the
workers role both use these helpers; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
import msgspec

from protocol.errors import EtcdTransactionFailed, QuireError, ValidationError
from protocol.job import JobRun, JobSpec, validate_job_name

from protocol.apply_chunks import MAX_TXN_BYTES, MAX_TXN_OPS, ApplyResult, Edit

from .etcd import cmp_mod, cmp_version, delete_op, prefix_end, put_op, txn
from .spec_apply import apply_edits

__all__ = [
    "JobNotFound",
    "JobStatus",
    "RunEntry",
    "apply_job",
    "apply_jobs",
    "create_run",
    "delete_job",
    "get_job",
    "get_run",
    "get_status",
    "lease_key",
    "leases_prefix",
    "list_jobs",
    "list_runs",
    "put_status",
    "run_key",
    "runs_prefix",
    "spec_key",
    "specs_prefix",
    "status_key",
    "update_run",
]


class JobNotFound(QuireError, LookupError):
    """No job spec (or run) by that name."""


class JobStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the scheduler last saw for a job (shown by `quire jobs runs`)."""

    next_window: int = 0
    """Start of the next window without a run."""
    waiting_on: str = ""
    """The journal with the lowest watermark: the one holding the next window back."""
    watermark: float = 0.0
    """The lowest persisted watermark of the job's journals."""
    journals: int = 0
    note: str = ""
    reason: str = ""
    """Why the next window waits, per journal short of its end (+ delay), in words an
    operator acts on (workers/jobs_wait.py); empty while it is not due yet."""


def _root(root: str) -> str:
    return root.rstrip("/")


def specs_prefix(root: str) -> str:
    return f"{_root(root)}/jobs/specs/"


def spec_key(root: str, job: str) -> str:
    return specs_prefix(root) + job


def runs_prefix(root: str, job: str | None = None) -> str:
    return f"{_root(root)}/jobs/runs/" + (f"{job}#" if job is not None else "")


def run_key(root: str, job: str, window_start: int, rerun: int = 0) -> str:
    key = f"{runs_prefix(root, job)}{window_start:012d}"
    return key + (f"#r{rerun}" if rerun else "")


def leases_prefix(root: str) -> str:
    return f"{_root(root)}/jobs/leases/"


def lease_key(root: str, job: str, window_start: int, rerun: int = 0) -> str:
    return run_key(root, job, window_start, rerun).replace("/jobs/runs/", "/jobs/leases/", 1)


def status_key(root: str, job: str) -> str:
    return f"{_root(root)}/jobs/status/{job}"


@dataclass(frozen=True, slots=True)
class RunEntry:
    run: JobRun
    mod_revision: int
    key: str


_RUN = msgspec.json.Decoder(JobRun)
_SPEC = msgspec.json.Decoder(JobSpec)


async def apply_job(client: aetcd.Client, root: str, spec: JobSpec,
                    expect_mod_revision: int = -1) -> int:
    """Create or replace a spec (validated first). -1: no check; 0: must not exist."""
    spec.validate()
    key = spec_key(root, spec.name)
    compares = []
    if expect_mod_revision == 0:
        compares.append(cmp_version(key, 0))
    elif expect_mod_revision > 0:
        compares.append(cmp_mod(key, expect_mod_revision))
    result = await txn(client, compares, [put_op(key, msgspec.json.encode(spec))])
    if not result.succeeded:
        raise EtcdTransactionFailed(f"job {spec.name!r} changed since read; read it and re-apply")
    return result.revision


async def apply_jobs(client: aetcd.Client, root: str, specs: Sequence[JobSpec], *,
                     max_txn_size: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES,
                     progress: Any = None) -> ApplyResult:
    """Create or replace many specs (each validated first, no revision check) in
    transactions that fit etcd's limits (topology/spec_apply.py): a spec equal to the
    stored one is left unchanged; ApplyIncomplete names what was and was not applied
    when a transaction fails part-way."""
    seen: set[str] = set()
    edits = []
    for i, spec in enumerate(specs):
        try:
            spec.validate()
        except ValidationError as exc:
            raise exc.within(f"[{i}]" if len(specs) > 1 else "") from None
        if spec.name in seen:
            raise ValidationError(f"[{i}]", f"job {spec.name!r} appears twice")
        seen.add(spec.name)
        edits.append(Edit(spec.name, spec, -1, len(msgspec.json.encode(spec)), spec))
    return await apply_edits(client, specs_prefix(root), edits,
                             lambda _name, value: _SPEC.decode(value), what="job",
                             max_txn_size=max_txn_size, max_txn_bytes=max_txn_bytes,
                             progress=progress)


async def get_job(client: aetcd.Client, root: str, job: str) -> tuple[JobSpec, int]:
    validate_job_name(job, "job")
    got = await client.get(spec_key(root, job).encode())
    if got is None:
        raise JobNotFound(f"no job {job!r}")
    return _SPEC.decode(got.value), got.mod_revision


async def list_jobs(client: aetcd.Client, root: str) -> list[tuple[JobSpec, int]]:
    """Every decodable spec, by name (a malformed value is skipped)."""
    out = []
    for kv in (await client.get_prefix(specs_prefix(root).encode())).kvs:
        try:
            out.append((_SPEC.decode(kv.value), kv.mod_revision))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return sorted(out, key=lambda e: e[0].name)


async def delete_job(client: aetcd.Client, root: str, job: str, *, runs: bool = True) -> int:
    """Delete a spec (JobNotFound if absent), its status and, by default, its runs."""
    validate_job_name(job, "job")
    key = spec_key(root, job)
    ops = [delete_op(key), delete_op(status_key(root, job))]
    if runs:
        from aetcd import rpc

        start = runs_prefix(root, job).encode()
        ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
            key=start, range_end=prefix_end(start))))
    from aetcd import rpc

    exists = rpc.Compare(key=key.encode(), target=rpc.Compare.VERSION,
                         result=rpc.Compare.GREATER, version=0)
    result = await txn(client, [exists], ops)
    if not result.succeeded:
        raise JobNotFound(f"no job {job!r}")
    return result.revision


async def create_run(client: aetcd.Client, root: str, run: JobRun) -> bool:
    """Create the run only if no run of its (job, window, rerun) exists: the one
    compare-and-set that makes a window run once. True if this call created it."""
    key = run_key(root, run.job, run.window_start, run.rerun)
    result = await txn(client, [cmp_version(key, 0)], [put_op(key, msgspec.json.encode(run))])
    return result.succeeded


def _entry(kv: Any) -> RunEntry | None:
    try:
        return RunEntry(_RUN.decode(kv.value), kv.mod_revision, kv.key.decode())
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def get_run(client: aetcd.Client, root: str, job: str, window_start: int,
                  rerun: int = 0) -> RunEntry:
    got = await client.get(run_key(root, job, window_start, rerun).encode())
    entry = None if got is None else _entry(got)
    if entry is None:
        raise JobNotFound(f"job {job!r} has no run for window {window_start}"
                          + (f" (rerun {rerun})" if rerun else ""))
    return entry


async def list_runs(client: aetcd.Client, root: str, job: str | None = None) -> list[RunEntry]:
    """Runs of one job (or all), oldest window first."""
    if job is not None:
        validate_job_name(job, "job")
    out = [e for kv in (await client.get_prefix(runs_prefix(root, job).encode())).kvs
           if (e := _entry(kv)) is not None]
    return sorted(out, key=lambda e: (e.run.job, e.run.window_start, e.run.rerun))


async def update_run(client: aetcd.Client, root: str, run: JobRun, mod_revision: int,
                     ops: Sequence[Any] = (), compares: Sequence[Any] = ()) -> int | None:
    """Write `run` if its key is still at `mod_revision` (plus any extra ops, in the same
    transaction). The new mod revision, or None if someone else changed it first."""
    key = run_key(root, run.job, run.window_start, run.rerun)
    result = await txn(client, [cmp_mod(key, mod_revision), *compares],
                       [put_op(key, msgspec.json.encode(run)), *ops])
    return result.revision if result.succeeded else None


async def get_status(client: aetcd.Client, root: str, job: str) -> JobStatus | None:
    got = await client.get(status_key(root, job).encode())
    if got is None:
        return None
    try:
        return msgspec.json.decode(got.value, type=JobStatus)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def put_status(client: aetcd.Client, root: str, job: str, status: JobStatus) -> None:
    await txn(client, [], [put_op(status_key(root, job), msgspec.json.encode(status))])


def check_window(spec: JobSpec, window_start: int, path: str = "window") -> None:
    if window_start % spec.window:
        raise ValidationError(path, f"{window_start} is not the start of a "
                                    f"{spec.window}s window of job {spec.name!r}")
