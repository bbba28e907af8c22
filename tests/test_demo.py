"""`quire demo` (`make run`) end to end, and its closing jobs step (tools/demo_jobs.py).

The whole demo starts a local cluster and two Spark jobs: minutes on the shared 2-core
machine, so it runs when QUIRE_TEST_LONG=1 (CI runs the quick checks below)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.job import JobRun, RunState
from tools.demo_jobs import JOB, elide, first_window_succeeded

REPO = Path(__file__).resolve().parent.parent


def test_the_demo_waits_on_its_first_window_and_elides_long_run_lists() -> None:
    def run(w: int, state: RunState, rerun: int = 0) -> JobRun:
        return JobRun(job=JOB, window_start=w, window_end=w + 10, state=state, rerun=rerun)

    assert not first_window_succeeded([])
    assert not first_window_succeeded([run(20, RunState.SUCCEEDED), run(10, RunState.RUNNING)])
    assert first_window_succeeded([run(20, RunState.PENDING), run(10, RunState.SUCCEEDED),
                                   run(10, RunState.PENDING, rerun=1)])
    table = ["┏━", "┃ window", "┡━", *(f"│ {i}" for i in range(10)), "└━", "next: …"]
    assert elide(table) == ["┏━", "┃ window", "┡━", "│ 0", "│ 1", "│ 2",
                            "  … 5 more windows …", "│ 8", "│ 9", "└━", "next: …"]
    assert elide(table[:8]) == table[:8]


@pytest.mark.long
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not os.environ.get("QUIRE_TEST_LONG"),
                    reason="long test (the whole demo, with two Spark jobs): QUIRE_TEST_LONG=1")
def test_quire_demo_ends_with_a_succeeded_job_run(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tools.demo", str(tmp_path / "demo")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        out, _ = proc.communicate(timeout=1100)
    finally:
        if proc.poll() is None:  # its cluster's processes are in its session: stop them all
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert f"applied job {JOB}" in out, out[-4000:]
    assert f"first window of {JOB}: succeeded; 4000 messages counted" in out, out[-4000:]
    assert "succeeded" in out.split(f"quire jobs runs {JOB}")[1], out[-4000:]
