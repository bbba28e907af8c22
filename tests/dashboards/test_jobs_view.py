"""The live dashboard's jobs and watermark view: /api/state lists the jobs in a real etcd
(specs, runs and scheduler status in topology/jobs.py's layout) with their newest runs
and states, and joins each journal's persisted watermark from a real Redis (the hash
workers/watermark.py raises); a scoped token sees only the jobs over its journals; the
page renders them (headless Chromium, when installed)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from dashboards.access import visible_state
from dashboards.jobs import LAST_RUNS
from dashboards.server import DashboardServer
from dashboards.state import StateCollector
from fragment_store.index_keys import WATERMARKS_KEY
from protocol import FragmentSpec, JournalSpec
from protocol.auth import Capability, Claims, Scope
from protocol.job import JobRun, JobSpec, JobTarget, RunState
from tests.dashboards.test_live_dashboard import CHROMIUM, chromium
from tests.workers.workers_support import put_keys
from topology.jobs import JobStatus, run_key, spec_key, status_key

pytestmark = pytest.mark.timeout(120)

JOURNALS = ("acme/events/part-0", "acme/events/part-1")
OUTPUT = "acme/out/counts"
W = 10
T0 = 1_790_000_000  # a window start (divisible by 10)


def _keys(root: str) -> dict[str, bytes]:
    enc = msgspec.json.encode
    keys = {f"{root}/journals/{n}": enc(JournalSpec(name=n, replication=1,
                                                    fragment=FragmentSpec(length=1 << 20)))
            for n in (*JOURNALS, OUTPUT)}
    spec = JobSpec(name="acme/counts", selector="topic=acme", window=W, output=OUTPUT,
                   target=JobTarget(kind="celery", name="workers.jobs_targets.window_counts"),
                   start=float(T0))
    keys[spec_key(root, spec.name)] = enc(spec)
    idle = JobSpec(name="idle", selector="topic=none", window=3600,
                   target=JobTarget(name="x.y"), suspend=True)
    keys[spec_key(root, idle.name)] = enc(idle)
    ranges = {j: (0, 100) for j in JOURNALS}
    now = time.time()
    runs = []
    for i in range(LAST_RUNS + 2):  # more runs than are shown
        run = JobRun(job=spec.name, window_start=T0 + i * W, window_end=T0 + (i + 1) * W,
                     created=now, ranges=ranges).start("host:1", now)
        runs.append(run.succeed(now + 0.5))
    failed = JobRun(job=spec.name, window_start=T0 + 7 * W, window_end=T0 + 8 * W,
                    created=now, ranges=ranges).start("host:2", now)
    runs.append(failed.fail(now + 1, "boom: the target raised", retries=3, backoff=5))
    running = JobRun(job=spec.name, window_start=T0 + 8 * W, window_end=T0 + 9 * W,
                     created=now, ranges=ranges).start("host:3", now)
    runs.append(running)
    for run in runs:
        keys[run_key(root, run.job, run.window_start)] = enc(run)
    keys[run_key(root, spec.name, T0 + 20 * W)] = b"{not a run"
    keys[status_key(root, spec.name)] = enc(JobStatus(
        next_window=T0 + 9 * W, waiting_on=JOURNALS[1], watermark=T0 + 8 * W + 3, journals=2))
    return keys


@pytest.mark.asyncio(loop_scope="session")
async def test_state_lists_jobs_with_their_newest_runs_and_each_journals_watermark(
        etcd, etcd_root, redis_db) -> None:  # type: ignore[no-untyped-def]
    put_keys(etcd, _keys(etcd_root))
    marks = {JOURNALS[0]: T0 + 95.5, JOURNALS[1]: T0 + 83.25}
    redis_db.client.hset(WATERMARKS_KEY, mapping={**marks, "acme/garbled": "soon"})
    collector = StateCollector(etcd.url, etcd_root, timeout=2.0, redis_url=redis_db.url)
    try:
        state = await collector.snapshot()
    finally:
        await collector.close()

    by_name = {j["name"]: j for j in state["journals"]}
    assert by_name[JOURNALS[0]]["watermark"] == marks[JOURNALS[0]]
    assert by_name[JOURNALS[1]]["watermark"] == marks[JOURNALS[1]]
    assert by_name[OUTPUT]["watermark"] is None  # no watermark recorded for it
    assert [e for e in state["errors"] if e.startswith("redis:")] == [
        "redis: watermark of acme/garbled: b'soon' is not a number"], state["errors"]

    jobs = {j["name"]: j for j in state["jobs"]}
    assert list(jobs) == ["acme/counts", "idle"]
    job = jobs["acme/counts"]
    assert job["window"] == "10s" and job["output"] == OUTPUT
    assert job["target"] == "celery:workers.jobs_targets.window_counts"
    assert job["counts"] == {"succeeded": LAST_RUNS + 2, "failed": 1, "running": 1}
    assert job["last_state"] == "running"
    shown = job["runs"]
    assert len(shown) == LAST_RUNS
    assert [r["window_start"] for r in shown] == [T0 + i * W for i in range(4, 9)]
    assert [r["state"] for r in shown] == ["succeeded"] * 3 + ["failed", "running"]
    fail = shown[3]
    assert fail["error"] == "boom: the target raised" and fail["retry_at"] is not None
    assert fail["worker"] == "host:2" and fail["took"] == pytest.approx(1.0)
    assert shown[4]["took"] is None and shown[4]["journals"] == list(JOURNALS)
    assert job["status"]["waiting_on"] == JOURNALS[1]
    assert job["status"]["next_window"] == T0 + 9 * W
    # The lowest watermark of the journals the job reads, as Redis has it now.
    assert job["status"]["watermark_now"] == marks[JOURNALS[1]]
    idle = jobs["idle"]
    assert idle["suspend"] and idle["runs"] == [] and idle["counts"] == {}
    assert idle["status"] is None and idle["last_state"] is None
    assert not [k for k in state["etcd"]["malformed_keys"] if "/jobs/" in k]

    # A token scoped to acme/ sees the job over acme's journals, not the one naming none.
    claims = Claims(subject="t", caps=Capability.READ, scope=Scope(prefixes=("acme/",)),
                    issued_at=0, expires_at=2e9)
    assert [j["name"] for j in visible_state(state, claims)["jobs"]] == ["acme/counts"]
    other = Claims(subject="t", caps=Capability.READ, scope=Scope(prefixes=("acme/events/",)),
                   issued_at=0, expires_at=2e9)
    assert visible_state(state, other)["jobs"] == []  # its output is out of that scope


@pytest.mark.asyncio(loop_scope="session")
async def test_without_redis_jobs_are_listed_and_watermarks_are_unknown(
        etcd, etcd_root) -> None:  # type: ignore[no-untyped-def]
    put_keys(etcd, _keys(etcd_root))
    collector = StateCollector(etcd.url, etcd_root, timeout=2.0)
    try:
        state = await collector.snapshot()
    finally:
        await collector.close()
    assert {j["name"]: j["watermark"] for j in state["journals"]} == {
        n: None for n in (*JOURNALS, OUTPUT)}
    job = next(j for j in state["jobs"] if j["name"] == "acme/counts")
    assert job["last_state"] == RunState.RUNNING.value
    assert "watermark_now" not in job["status"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make system-deps)")
@pytest.mark.asyncio(loop_scope="session")
async def test_page_renders_jobs_and_watermarks(
        etcd, etcd_root, redis_db) -> None:  # type: ignore[no-untyped-def]
    put_keys(etcd, _keys(etcd_root))
    redis_db.client.hset(WATERMARKS_KEY, mapping={JOURNALS[0]: T0 + 95.5})
    server = DashboardServer(StateCollector(etcd.url, etcd_root, timeout=2.0,
                                            redis_url=redis_db.url), port=0)
    await server.start()
    try:
        proc = await asyncio.to_thread(chromium, f"http://127.0.0.1:{server.port}/", "--dump-dom")
    finally:
        await server.close()
        await server.collector.close()
    dom = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert 'data-ready="1"' in dom, dom[:2000]
    assert 'data-job="acme/counts"' in dom and 'data-job="idle"' in dom
    assert "boom: the target raised" in dom and "waits on acme/events/part-1" in dom
    # T0 + 95.5 s is 2026-09-21T14:14:55.500Z: the journal's watermark cell shows it.
    assert "14:14:55" in dom and "persisted watermark" in dom
