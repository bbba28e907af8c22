"""`quire doctor` against a real `quire up --secure` (one for the module), as a user in a
second terminal would run it: a healthy cluster passes (exit 0), and each stall of
issue #51 fails it (exit 6) under its own name —

* case 2, `store-accepted-by-no-worker`: a journal whose store no live worker writes to
  (applied through the client, past `journals apply`'s own check);
* case 1, `job-window-waiting`: a job over that journal, whose window can never
  complete, reported with the scheduler's reason;
* case 3, `leftover-local-cluster`: members running in a data dir whose `quire up` is
  dead — built from a real process and an env file naming a dead pid, and (if the
  members outlive it today) by SIGKILL of the module's own `quire up`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol.discovery import ENV_FILE, format_env
from tools.doctor_probe import local_facts
from tools.services import QuireUpService, free_port, wait_for

pytestmark = pytest.mark.timeout(400)

REPO = Path(__file__).resolve().parents[2]
ELSEWHERE = "doctor/elsewhere"
JOB = "doctor/elsewhere-counts"


def doctor(data_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli.main", "doctor", "--data-dir", str(data_dir),
         "--format", "json", "--timeout", "2", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
             "HOME": str(data_dir.parent)})
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"doctor printed no JSON (exit {proc.returncode}): "
                             f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}") from None
    return proc.returncode, report


def named(report: dict[str, Any], name: str) -> list[dict[str, str]]:
    return [f for f in report["findings"] if f["name"] == name]


def failing(report: dict[str, Any]) -> list[str]:
    return [f"{f['name']}: {f['subject']}: {f['message']}" for f in report["findings"]
            if f["level"] == "fail"]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("doctor")
    svc = QuireUpService(base / "data", "--secure",
                         env={"PYTHONPATH": str(REPO), "HOME": str(base), "QUIRE_DATA_DIR": "",
                              "XDG_DATA_HOME": ""})
    svc.start()
    try:
        yield svc
    except BaseException:
        print(svc.log_tail(80))
        raise
    finally:
        svc.close()


@pytest.fixture(scope="module")
def elsewhere(up: QuireUpService, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Case 2: a journal on a store no worker writes to, with acknowledged appends."""
    from protocol import FragmentSpec, JournalSpec, LabelSet
    from protocol.tls import client_context
    from quire.client import SyncClient

    store = tmp_path_factory.mktemp("elsewhere").as_uri() + "/"
    v = up.variables
    client = SyncClient([v["QUIRE_BROKER"]], token=v["QUIRE_TOKEN"], retry_timeout=30,
                        ssl=client_context(v["QUIRE_TLS_CA"], v["QUIRE_TLS_CERT"],
                                           v["QUIRE_TLS_KEY"]))
    try:
        client.apply([JournalSpec(name=ELSEWHERE, replication=1,
                                  labels=LabelSet.of({"topic": "elsewhere"}),
                                  fragment=FragmentSpec(length=1024, stores=(store,)))])
        for i in range(20):  # ~2 KiB: fragments roll, and their persist tasks are refused
            client.append(ELSEWHERE, (f"line {i} " + "x" * 100 + "\n").encode())
    finally:
        client.close()
    return store


def test_doctor_passes_a_healthy_cluster(up: QuireUpService) -> None:
    rc, report = doctor(up.data_dir)
    assert rc == 0 and report["ok"], failing(report)
    names = {f["name"] for f in report["findings"]}
    assert {"local-cluster", "etcd", "redis", "coordinator", "worker", "certificate"} <= names, \
        report["findings"]
    # The queues are asked over Celery's control channel, which the operator's Redis user
    # of a --secure local cluster may not use: checked, or said to be skipped.
    assert "worker-queues" in names or any(
        f["subject"] == "worker queues" for f in named(report, "skipped")), report["findings"]
    assert not named(report, "leftover-local-cluster")


def test_doctor_names_a_store_no_worker_accepts(up: QuireUpService, elsewhere: str) -> None:
    rc, report = doctor(up.data_dir)
    assert rc == 6 and not report["ok"]
    found = named(report, "store-accepted-by-no-worker")
    assert [f["subject"] for f in found] == [f"journal {ELSEWHERE}"], failing(report)
    assert elsewhere in found[0]["message"] and "StoreNotAllowed" in found[0]["message"]
    assert "QUIRE_WORKER_STORES" in found[0]["mend"]

    def refused() -> dict[str, str] | None:  # the worker's refusals, read from Redis
        hits = named(doctor(up.data_dir)[1], "persist-refused")
        return hits[0] if hits else None

    hit = wait_for(refused, timeout=90, interval=1.0, what="doctor to report refused persists")
    assert hit["subject"] == f"journal {ELSEWHERE}" and "store not allowed" in hit["message"]


def test_doctor_names_a_job_window_that_waits(up: QuireUpService, elsewhere: str) -> None:
    spec = up.data_dir.parent / "job.yaml"
    spec.write_text(f"name: {JOB}\nselector: topic=elsewhere\nwindow: 10s\n"
                    "target: {kind: celery, name: workers.jobs_targets.window_counts}\n"
                    "output: doctor/out\n")
    subprocess.run([sys.executable, "-m", "tools.cli.main", "jobs", "apply", "-f", str(spec)],
                   check=True, capture_output=True, timeout=60, cwd=REPO,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
                        "HOME": str(up.data_dir.parent), "QUIRE_DATA_DIR": str(up.data_dir)})

    def waiting() -> dict[str, str] | None:
        rc, report = doctor(up.data_dir, "--job-grace", "5")
        found = named(report, "job-window-waiting")
        return found[0] if rc == 6 and found else None

    found = wait_for(waiting, timeout=120, interval=1.0,
                     what="doctor to report the job's window as waiting")
    assert found["subject"] == f"job {JOB}"
    # The scheduler's reason, naming the journal it waits on (workers/jobs_wait.py).
    assert f"waits on {ELSEWHERE}" in found["message"]
    assert f"{ELSEWHERE}: " in found["message"].split("):", 1)[1], found["message"]
    assert f"quire jobs runs {JOB}" in found["mend"]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_doctor_names_members_left_without_their_quire_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "redis").mkdir(parents=True)
    port = free_port()
    (data / ENV_FILE).write_text(format_env({"QUIRE_REDIS_URL": f"redis://127.0.0.1:{port}/0"},
                                            _dead_pid(), data))
    member = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], cwd=data / "redis",
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(p.pid == member.pid for p in local_facts(data).members),
                 timeout=10, what="the member to work in the data dir")
        rc, report = doctor(data)
        assert rc == 6
        found = named(report, "leftover-local-cluster")
        assert len(found) == 1, failing(report)
        assert str(member.pid) in found[0]["message"] and f"kill {member.pid}" in found[0]["mend"]
    finally:
        member.terminate()
        member.wait(10)


def test_doctor_after_quire_up_is_killed(up: QuireUpService) -> None:
    """Last in the module: SIGKILL of `quire up` alone (not its members). Members that
    outlive it are reported by pid; members that stop with it leave nothing to report."""
    before = {p.pid for p in local_facts(up.data_dir).members}
    assert before, "quire up's members work in its data dir"
    assert up.pid is not None
    os.kill(up.pid, signal.SIGKILL)
    wait_for(lambda: up.returncode is not None, timeout=10, what="quire up to die")
    try:
        rc, report = doctor(up.data_dir)
        # Alive after the doctor ran: alive while it looked.
        still = {p.pid for p in local_facts(up.data_dir).members} & before
        found = named(report, "leftover-local-cluster")
        if found:
            assert rc == 6 and len(found) == 1, failing(report)
            assert all(str(pid) in found[0]["mend"] for pid in still), (still, found)
        else:
            assert not still, f"members {still} left running, and doctor did not say so"
    finally:
        for p in local_facts(up.data_dir).members:  # our quire up's members: ours to stop
            if p.pid in before:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
