"""The harness's bounded waits (chaos/bounded.py): a wait that would never end is given
up at its bound, named with where it was stuck, and the run ends "not ok" instead of
hanging (seed 9 of the disk/clock/lock campaign hung after its read-back). No cluster:
the things waited on here are made to hang on purpose."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos.bounded import DaemonThreads, HarnessStall, Stalls, where
from chaos.campaign import row_of, table
from chaos.checker import check

BOUND = 0.3


async def _swallows_cancellation(release: asyncio.Event) -> None:
    """A task that outlives its cancellation (a generator being closed, a gRPC call...)."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue


async def test_a_wait_past_its_bound_is_given_up_and_named_with_where_it_was_stuck() -> None:
    stalls, release = Stalls(), asyncio.Event()
    stuck = asyncio.ensure_future(_swallows_cancellation(release))
    t0 = time.monotonic()
    got = await stalls.wait("the thing that never ends", stuck, BOUND, default="gave up",
                            grace=BOUND)
    assert got == "gave up"
    assert time.monotonic() - t0 < 10 * BOUND  # bound + grace, never the task's will
    [stall] = stalls.items
    assert stall.startswith("the thing that never ends: not done within 0.3 s")
    assert "_swallows_cancellation" in stall and "abandoned" in stall
    release.set()
    await asyncio.wait({stuck}, timeout=5)


async def test_a_required_step_that_stalls_ends_the_run_with_its_name() -> None:
    stalls = Stalls()
    with pytest.raises(HarnessStall, match="the read-back: not done within"):
        await stalls.wait("the read-back", asyncio.sleep(3600), BOUND, required=True)
    assert len(stalls.items) == 1


async def test_a_wait_that_finishes_in_time_returns_its_result_or_raises_its_error() -> None:
    stalls = Stalls()

    async def answer() -> int:
        return 42

    async def fails() -> None:
        raise ValueError("boom")

    assert await stalls.wait("an answer", answer(), 5.0) == 42
    with pytest.raises(ValueError, match="boom"):
        await stalls.wait("a failure", fails(), 5.0)
    assert stalls.items == []


async def test_a_blocking_call_past_its_bound_is_left_on_its_thread_and_named() -> None:
    stalls, release = Stalls(), threading.Event()
    got = await stalls.thread("the disks to unmount", release.wait, 3600, timeout=BOUND,
                              default="left")
    try:
        assert got == "left"
        [stall] = stalls.items
        assert stall.startswith("the disks to unmount: not done within")
        assert "a thread blocked in" in stall and "wait" in stall
        assert await stalls.thread("a quick call", sum, [1, 2], timeout=5.0) == 3
    finally:
        release.set()


_RUN = """
import asyncio, threading, time
from chaos.bounded import run

release = threading.Event()

async def deaf():
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue

async def main():
    loop = asyncio.get_running_loop()
    loop.run_in_executor(None, release.wait)            # a call stuck for good
    asyncio.ensure_future(deaf())                        # a task deaf to cancellation
    # 40 calls stuck: with a default executor (6 workers here) the next one would wait.
    stuck = [asyncio.ensure_future(asyncio.to_thread(release.wait)) for _ in range(40)]
    print(await asyncio.wait_for(asyncio.to_thread(lambda: "a later call ran"), 5.0))
    return "main returned"

t0 = time.monotonic()
print(run(main(), grace=0.3))
print(f"run returned after {time.monotonic() - t0:.1f}s")
"""


def test_run_returns_and_the_process_exits_despite_stuck_threads_and_deaf_tasks() -> None:
    """asyncio.run would wait forever for both at its shutdown, and the interpreter for
    the executor's threads at its exit (Python 3.11): the seed-9 symptom."""
    proc = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "a later call ran" in lines and "main returned" in lines
    assert "harness.tasks_abandoned" in out and "deaf" in out  # named, with where it waits
    assert "harness.threads_left" in out


def test_daemon_threads_say_what_still_runs() -> None:
    ex, release = DaemonThreads(), threading.Event()
    fut = ex.submit(release.wait, 3600)
    time.sleep(0.05)
    try:
        [line] = ex.running()
        assert "wait" in line
    finally:
        release.set()
    assert fut.result(timeout=5) is True
    ex.shutdown()


async def test_where_follows_the_await_chain_into_tasks() -> None:
    async def inner() -> None:
        await asyncio.sleep(3600)

    async def outer() -> None:
        await asyncio.ensure_future(inner())

    task = asyncio.ensure_future(outer())
    await asyncio.sleep(0.01)
    chain = where(task)
    assert "outer" in chain and "inner" in chain and chain.index("outer") < chain.index("inner")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_stalls_make_the_run_not_ok_in_its_report_and_the_campaign_table() -> None:
    report = check([], [], [])
    report.add_stalls(["healing: not done within 600 s (waiting at nemesis.py:250 _restart)"])
    summary = {**report.to_json(), "run": {}}
    assert summary["counts"]["harness_stalls"] == 1
    assert summary["safe"]  # liveness, not safety
    row = row_of(9, 60.0, summary, 70.0)
    text = table([row])
    assert "1 harness stalls" in text and "1 runs not ok" in text


_SIGTERM = """
import asyncio
from chaos.bounded import run

async def main():
    try:
        print("running", flush=True)
        await asyncio.Event().wait()
    finally:
        print("cleaned up", flush=True)   # where a chaos run stops its cluster

try:
    run(main(), grace=0.3)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_sigterm_cancels_the_run_as_ctrl_c_does() -> None:
    """`timeout 600 quire chaos …`: SIGTERM ends the run through its clean-up (which stops
    its members) instead of killing the interpreter with every `finally` unrun."""
    import signal

    proc = subprocess.Popen([sys.executable, "-c", _SIGTERM], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.split() == ["cleaned", "up", "interrupted"], out
