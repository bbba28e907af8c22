"""Job specs, run transitions and the scheduler's plan: pure, no services."""

from __future__ import annotations

import pytest

from protocol.errors import ValidationError
from protocol.job import JobRun, JobSpec, RunState, parse_window, run_identity, window_of
from tools.cli.jobs import parse
from workers.jobs_plan import plan

TARGET = {"kind": "celery", "name": "workers.jobs_targets.window_counts"}


def spec(**kw: object) -> JobSpec:
    data = {"name": "counts", "selector": "topic=events", "window": "10s", "target": TARGET,
            "start": 1000, **kw}
    return JobSpec.from_obj(data)


@pytest.mark.parametrize("text,seconds", [("10s", 10), ("15m", 900), ("1h", 3600),
                                          ("1d", 86400), (60, 60), ("2d", 172800)])
def test_windows_parse_aligned(text: object, seconds: int) -> None:
    assert parse_window(text) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("bad,field,words", [
    ({"window": "7s"}, "window", "divide a day"),
    ({"window": "1.5s"}, "window", "whole number"),
    ({"window": "40d"}, "window", "out of range"),
    ({"selector": ""}, "selector", "non-empty"),
    ({"selector": "a in ("}, "selector", ""),
    ({"target": {"kind": "cron", "name": "x"}}, "target.kind", "expected one of"),
    ({"target": {"kind": "celery", "name": "not a name"}}, "target.name", "dotted"),
    ({"target": {"kind": "spark", "name": "spark.jobs.window_counts"}}, "target.name",
     "module of spark/jobs/"),
    ({"target": {"kind": "dask", "name": "spark.jobs.dask_targets"}}, "target.name",
     "package.module:function"),
    ({"target": {"kind": "dask", "name": "spark..jobs:f"}}, "target.name", "dotted module"),
    ({"target": {"kind": "dask", "name": "spark.jobs.dask_targets:window-counts"}},
     "target.name", "not a function name"),
    ({"target": {"kind": "dask", "name": ":f"}}, "target.name", "package.module:function"),
    ({"retries": -1}, "retries", "out of range"),
    ({"backoff": "soon"}, "backoff", "not a duration"),
    ({"start": "yesterday"}, "start", "not a time"),
    ({"output": "/abs"}, "output", ""),
    ({"name": "a//b"}, "name", "clean path"),
    ({"max_concurrent": 0}, "max_concurrent", "out of range"),
])
def test_bad_specs_name_the_field(bad: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(**bad)
    assert info.value.path == field
    assert words in info.value.reason


def test_spec_round_trips_through_its_human_form() -> None:
    s = spec(start="2026-11-26T14:00:00Z", backoff="2s", args={"field": "key"})
    assert JobSpec.from_obj(s.to_obj()) == s
    assert s.to_obj()["window"] == "10s" and s.to_obj()["start"] == "2026-11-26T14:00:00Z"


def test_a_dask_target_names_a_function_the_runner_loads() -> None:
    from spark.jobs import dask_targets
    from spark.jobs.dask_run import TargetError, load

    s = spec(target={"kind": "dask", "name": "spark.jobs.dask_targets:window_counts"})
    assert (s.target.kind, s.target.name) == ("dask", "spark.jobs.dask_targets:window_counts")
    assert JobSpec.from_obj(s.to_obj()) == s
    assert load(s.target.name) is dask_targets.window_counts
    for name, words in (("spark.jobs.no_such_module:f", "cannot import 'spark.jobs.no_such"),
                        ("spark.jobs.dask_targets:nothing", "has no 'nothing'"),
                        ("spark.jobs.dask_targets:__all__", "not a function"),
                        ("spark.jobs.dask_targets", "package.module:function")):
        with pytest.raises(TargetError, match=words):
            load(name)


def test_cli_file_errors_carry_the_document_path() -> None:
    with pytest.raises(ValidationError) as info:
        parse("jobs:\n  - {name: a, selector: 'app=yy', window: 10s, target: {name: t}}\n"
              "  - {name: b, selector: 'app=yy', window: 7s, target: {name: t}}\n", "f.yaml")
    assert info.value.path == "f.yaml.jobs[1].window"
    with pytest.raises(ValidationError, match="appears twice"):
        parse("- {name: a, selector: 'app=yy', window: 10s, target: {name: t}}\n" * 1
              + "- {name: a, selector: 'app=yy', window: 10s, target: {name: t}}\n")


def test_run_attempts_back_off_then_give_up() -> None:
    run = JobRun(job="j", window_start=10, window_end=20)
    run = run.start("w1", 100.0).fail(101.0, "boom", retries=2, backoff=2.0)
    assert (run.state, run.attempt, run.not_before) == (RunState.FAILED, 1, 103.0)
    run = run.start("w2", 103.0).fail(104.0, "boom", retries=2, backoff=2.0)
    assert (run.state, run.not_before) == (RunState.FAILED, 108.0)  # doubled
    run = run.start("w1", 108.0).fail(109.0, "boom", retries=2, backoff=2.0)
    assert run.state == RunState.GAVE_UP and run.final
    assert [a.worker for a in run.attempts] == ["w1", "w2", "w1"]
    with pytest.raises(ValidationError):
        run.start("w3", 110.0)


def test_every_attempt_shares_its_output_identity_and_a_rerun_has_its_own() -> None:
    run = JobRun(job="j", window_start=10, window_end=20)
    again = run.start("w", 1.0).fail(2.0, "x", 3, 1.0).start("w2", 4.0)
    assert again.identity() == run.identity() == run_identity("j", 10)
    assert again.idempotency_key == "job/j/10"
    rerun = again.succeed(5.0).rerun_of(6.0)
    assert rerun.identity() != run.identity() and rerun.idempotency_key == "job/j/10/rerun-1"
    assert rerun.state == RunState.PENDING and rerun.attempt == 0


def test_plan_creates_complete_windows_only() -> None:
    s = spec(start=1000, delay=2)
    p = plan(s, [], {"a": 1031.0, "b": 1045.0}, leased=set(), dispatched=set(), now=1050.0)
    # lowest watermark 1031 - delay 2 = 1029: windows [1000,1010) and [1010,1020) only.
    assert p.create == [1000, 1010] and p.waiting_on == "a" and p.next_window == 1020
    runs = [JobRun(job="counts", window_start=w, window_end=w + 10) for w in (1000, 1010)]
    p = plan(s, runs, {"a": 1031.0, "b": 1045.0}, leased=set(), dispatched=set(), now=1050.0)
    assert p.create == []
    assert window_of(1019.9, 10) == 1010


def test_plan_declares_lost_runs_and_respects_concurrency() -> None:
    s = spec(max_concurrent=2)
    r = {"a": (0, 1)}
    running = JobRun(job="counts", window_start=1000, window_end=1010, ranges=r).start("w", 1.0)
    alive = JobRun(job="counts", window_start=1010, window_end=1020, ranges=r).start("w", 1.0)
    due = [JobRun(job="counts", window_start=w, window_end=w + 10, ranges=r)
           for w in (1020, 1030, 1040)]
    p = plan(s, [running, alive, *due], {"a": 1045.0}, leased={(1010, 0)}, dispatched=set(),
             now=2000.0)
    assert [x.window_start for x in p.lost] == [1000]
    assert [x.window_start for x in p.dispatch] == [1020]  # one slot left: 1010 holds one
    backfilled = JobRun(job="counts", window_start=900, window_end=910, backfill=True)
    p = plan(s, [backfilled], {"a": 905.0}, leased=set(), dispatched=set(), now=2000.0)
    assert p.need_ranges == []  # its window is not complete yet
    p = plan(s, [backfilled], {"a": 915.0}, leased=set(), dispatched=set(), now=2000.0)
    assert p.need_ranges == [backfilled]


def test_plan_with_no_journals_waits() -> None:
    p = plan(spec(), [], {}, leased=set(), dispatched=set(), now=5000.0)
    assert p.create == [] and p.waiting_on == ""
