"""Job specifications and runs: what etcd stores under `<root>/jobs/` (topology/jobs.py).

A job is a batch computation over the journals a label selector matches, run once per
aligned time window when every one of those journals is persisted past the window's end
(docs/jobs.md, "The watermark"):

    name: counts/per-10s
    selector: "topic=events"
    window: 10s                 # 10s, 15m, 1h, 1d ... aligned to the Unix epoch
    target:
      kind: celery              # celery: any task by name | spark: spark/jobs/<name>
      name: workers.jobs_targets.window_counts  # | dask: package.module:function
    args: {field: key}
    output: demo/job-counts     # the output journal
    retries: 3
    backoff: 2s                 # doubled per attempt
    delay: 0s                   # extra wait for late data past the watermark
    start: "2026-11-26T14:00:00Z"
    max_concurrent: 2           # runs of this job executing at once (backfills too)

Validation raises ValidationError naming the field, like JournalSpec and ShardSpec.
A run (`JobRun`) is one window of one job; its state machine is pure (`JobRun.*`
transitions return new runs) so the scheduler's etcd compare-and-sets carry it.
"""

from __future__ import annotations

import datetime as _dt
import enum
import hashlib
from typing import Any

import msgspec

from .errors import ValidationError
from .labels import parse_selector
from .names import validate_journal_name, validate_path
from .spec import parse_duration

__all__ = [
    "JobRun",
    "JobSpec",
    "JobTarget",
    "RunAttempt",
    "RunState",
    "TARGET_KINDS",
    "format_window",
    "parse_time",
    "parse_window",
    "run_identity",
    "validate_function_name",
    "validate_job_name",
    "window_of",
]

JOB_NAME_MIN, JOB_NAME_MAX = 1, 200
MIN_WINDOW, MAX_WINDOW = 1.0, 31 * 86400.0
MAX_RETRIES = 100
MAX_CONCURRENT = 64
TARGET_KINDS = ("celery", "spark", "dask")
"""`celery`: a Celery task by name; `spark`: a module of spark/jobs/ run as a process;
`dask`: a Python function `package.module:function` run as a process (Dask inside)."""
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def validate_job_name(name: str, path: str = "name") -> None:
    """A clean path: it becomes an etcd key segment and part of producer names."""
    validate_path(name, path, JOB_NAME_MIN, JOB_NAME_MAX)
    if any(part.startswith(".") for part in name.split("/")):
        raise ValidationError(path, f"{name!r}: a path segment may not begin with '.'")


def validate_function_name(name: str, path: str = "target.name") -> None:
    """`package.module:function` (a dotted module, a colon, a function of it)."""
    module, colon, function = name.partition(":")
    if not colon or not module or not function:
        raise ValidationError(path, f"{name!r}: a dask target names a function as "
                                    "package.module:function (e.g. "
                                    "spark.jobs.dask_targets:window_counts)")
    if not all(p.isidentifier() for p in module.split(".")):
        raise ValidationError(path, f"{name!r}: {module!r} is not a dotted module name")
    if not function.isidentifier():
        raise ValidationError(path, f"{name!r}: {function!r} is not a function name")


def parse_window(value: str | int | float, path: str = "window") -> int:
    """Whole seconds of a window (`10s`, `15m`, `1h`, `1d`, or seconds)."""
    seconds = parse_duration(value, path)
    if seconds != int(seconds):
        raise ValidationError(path, f"{value!r}: a window is a whole number of seconds")
    if not (MIN_WINDOW <= seconds <= MAX_WINDOW):
        raise ValidationError(path, f"{value!r} out of range [1s, 31d]")
    if 86400 % seconds and seconds % 86400:
        # Aligned to the epoch, a window that neither divides a day nor is whole days
        # would start at a different time of day each day: refuse it, name the rule.
        raise ValidationError(path, f"{value!r}: a window must divide a day (1s ... 12h) "
                                    "or be whole days")
    return int(seconds)


def format_window(seconds: int) -> str:
    for unit, size in _UNITS:
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"  # pragma: no cover - every integer divides by 1


def parse_time(value: str | int | float, path: str = "start") -> float:
    """Unix seconds from a number or an ISO-8601 time (naive times are UTC)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(path, f"{value!r} is not a time (Unix seconds or ISO-8601)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.timestamp()


def window_of(t: float, window: int) -> int:
    """Start of the aligned window holding time `t`."""
    return int(t // window) * window


def iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class JobTarget(msgspec.Struct, frozen=True, kw_only=True):
    kind: str = "celery"
    """`celery`: any Celery task by name; `spark`: a module of spark/jobs/ started as a
    process (`python -m spark.jobs.<name> --run '<run context JSON>'`); `dask`: a function
    named `package.module:function`, called with the run context by the Dask runner
    process (`python -m spark.jobs.dask_run --target <name> --run '<JSON>'`)."""
    name: str = ""

    def validate(self, path: str = "target") -> None:
        if self.kind not in TARGET_KINDS:
            raise ValidationError(f"{path}.kind", f"{self.kind!r}; expected one of {TARGET_KINDS}")
        if not self.name:
            raise ValidationError(f"{path}.name", "a target needs a name")
        if self.kind == "dask":
            validate_function_name(self.name, f"{path}.name")
            return
        parts = self.name.split(".")
        if not all(p.isidentifier() for p in parts):
            raise ValidationError(f"{path}.name", f"{self.name!r} is not a dotted Python name")
        if self.kind == "spark" and len(parts) != 1:
            raise ValidationError(f"{path}.name", f"{self.name!r}: a spark target names a module "
                                                  "of spark/jobs/ (e.g. window_counts)")


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    selector: str
    window: int
    """Seconds (YAML may say `10s`, `15m`, `1h`, `1d`: see `from_obj`)."""
    target: JobTarget
    output: str = ""
    """The output journal (targets append their results there, identified by run)."""
    args: dict[str, Any] = {}
    retries: int = 3
    backoff: float = 5.0
    delay: float = 0.0
    start: float = 0.0
    """Unix seconds: the first window scheduled is the one holding `start` (0: the window
    holding the time the spec was first applied, set by `quire jobs apply`)."""
    max_concurrent: int = 2
    timeout: float = 3600.0
    """A run's attempt that runs longer than this fails (and is retried)."""
    suspend: bool = False

    @classmethod
    def from_obj(cls, obj: Any, path: str = "") -> JobSpec:
        """A spec from YAML/JSON data, with durations and times in human form."""
        if not isinstance(obj, dict):
            raise ValidationError(path, "a job spec is a mapping")
        data = dict(obj)
        at = (lambda f: f"{path}.{f}" if path else f)  # noqa: E731
        if "window" in data:
            data["window"] = parse_window(data["window"], at("window"))
        for field in ("backoff", "delay", "timeout"):
            if field in data:
                data[field] = parse_duration(data[field], at(field))
        if "start" in data:
            data["start"] = parse_time(data["start"], at("start"))
        try:
            spec = msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise ValidationError(path or "spec", str(exc)) from None
        spec.validate(path)
        return spec

    def to_obj(self) -> dict[str, Any]:
        """The human form `from_obj` reads back."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        out["window"] = format_window(self.window)
        out["start"] = iso(self.start) if self.start else 0
        return out

    def validate(self, path: str = "") -> None:
        def at(field: str) -> str:
            return f"{path}.{field}" if path else field

        validate_job_name(self.name, at("name"))
        try:
            parse_selector(self.selector)
        except ValidationError as exc:
            raise ValidationError(at("selector"), exc.reason) from None
        if not self.selector.strip():
            raise ValidationError(at("selector"), "a job needs a non-empty selector")
        parse_window(self.window, at("window"))
        self.target.validate(at("target"))
        if self.output:
            validate_journal_name(self.output, at("output"))
        if not (0 <= self.retries <= MAX_RETRIES):
            raise ValidationError(at("retries"), f"{self.retries} out of range [0, {MAX_RETRIES}]")
        for field, value, low, high in (("backoff", self.backoff, 0.0, 86400.0),
                                        ("delay", self.delay, 0.0, 7 * 86400.0),
                                        ("timeout", self.timeout, 1.0, 7 * 86400.0)):
            if not (low <= value <= high):
                raise ValidationError(at(field), f"{value}s out of range [{low}, {high}]")
        if self.start < 0:
            raise ValidationError(at("start"), f"{self.start} must be >= 0")
        if not (1 <= self.max_concurrent <= MAX_CONCURRENT):
            raise ValidationError(at("max_concurrent"),
                                  f"{self.max_concurrent} out of range [1, {MAX_CONCURRENT}]")

    def first_window(self) -> int:
        return window_of(self.start, self.window)


class RunState(str, enum.Enum):
    PENDING = "pending"
    """Created; waits for a worker (and, after a failure, for its backoff)."""
    RUNNING = "running"
    """A worker holds the run's lease and executes it."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """An attempt failed; the run is retried at `not_before`."""
    GAVE_UP = "gave_up"
    """Every attempt failed (retries exhausted)."""


FINAL = (RunState.SUCCEEDED, RunState.GAVE_UP)


class RunAttempt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    attempt: int
    worker: str = ""
    started: float = 0.0
    finished: float = 0.0
    error: str = ""


class JobRun(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    job: str
    window_start: int
    window_end: int
    state: RunState = RunState.PENDING
    attempt: int = 0
    """Attempts started so far."""
    rerun: int = 0
    """0 for the window's first run; n for its n-th `quire jobs rerun`."""
    created: float = 0.0
    not_before: float = 0.0
    ranges: dict[str, tuple[int, int]] | None = None
    """journal -> [begin, end) offsets of the window, fixed once (so a retry reads the same
    rows); None until the scheduler computes it (a backfilled run)."""
    worker: str = ""
    result: Any = None
    attempts: tuple[RunAttempt, ...] = ()
    backfill: bool = False

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def start(self, worker: str, now: float) -> JobRun:
        if self.state not in (RunState.PENDING, RunState.FAILED):
            raise ValidationError("state", f"a {self.state.value} run cannot start")
        n = self.attempt + 1
        return msgspec.structs.replace(
            self, state=RunState.RUNNING, attempt=n, worker=worker,
            attempts=(*self.attempts, RunAttempt(attempt=n, worker=worker, started=now)))

    def _close(self, now: float, error: str) -> tuple[RunAttempt, ...]:
        if not self.attempts:
            return (RunAttempt(attempt=max(1, self.attempt), finished=now, error=error),)
        last = msgspec.structs.replace(self.attempts[-1], finished=now, error=error)
        return (*self.attempts[:-1], last)

    def succeed(self, now: float, result: Any = None) -> JobRun:
        return msgspec.structs.replace(self, state=RunState.SUCCEEDED, result=result,
                                       attempts=self._close(now, ""))

    def fail(self, now: float, error: str, retries: int, backoff: float) -> JobRun:
        """FAILED with a backoff doubling per attempt, or GAVE_UP once `retries` are spent."""
        attempts = self._close(now, error[:500])
        if self.attempt > retries:
            return msgspec.structs.replace(self, state=RunState.GAVE_UP, attempts=attempts)
        wait = min(backoff * (2 ** max(0, self.attempt - 1)), 3600.0)
        return msgspec.structs.replace(self, state=RunState.FAILED, attempts=attempts,
                                       not_before=now + wait)

    def rerun_of(self, now: float) -> JobRun:
        """A fresh run of the same window, with its own output identifiers."""
        return JobRun(job=self.job, window_start=self.window_start, window_end=self.window_end,
                      rerun=self.rerun + 1, created=now, ranges=self.ranges)

    def identity(self) -> tuple[str, int, int]:
        return run_identity(self.job, self.window_start, self.rerun)

    @property
    def idempotency_key(self) -> str:
        key = f"job/{self.job}/{self.window_start}"
        return key + (f"/rerun-{self.rerun}" if self.rerun else "")


def run_identity(job: str, window_start: int, rerun: int = 0) -> tuple[str, int, int]:
    """(producer, generation, history) of a run's identified appends: the same for every
    attempt of the run, so a retry's appends are answered with the first attempt's commits;
    a rerun has its own history, so its output is new."""
    producer = f"jobs/{job}"
    if len(producer) > 128 or any(c in "=%" for c in job):
        producer = "jobs/" + hashlib.sha1(job.encode()).hexdigest()
    # history: the window (seconds) times 1000 plus the rerun number — unique per
    # (window, rerun), never 0, well within u64.
    return producer, 1, window_start * 1000 + rerun + 1
