"""`quire up`'s supervision: the pure policy (tools/supervision.py), then its adapter
(tools/supervisor.py) over small real processes."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tools.services import Service, wait_for
from tools.supervision import Action, RestartPolicy, Supervision, describe_exit
from tools.supervisor import Supervisor, last_log_line

pytestmark = pytest.mark.timeout(60)


# -- the policy -------------------------------------------------------------------------

def test_backoff_doubles_per_exit_up_to_its_cap() -> None:
    s = Supervision(RestartPolicy(backoff=0.5, backoff_max=3.0, crash_loop_limit=10, window=60))
    delays = [s.exited("c0", t).delay for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert all(s.exited("c1", 5.0).action is Action.RESTART for _ in range(1))
    assert s.exited("c1", 6.0).delay == 1.0  # members are counted apart
    assert not s.crash_looped


def test_more_exits_than_the_limit_within_the_window_is_a_crash_loop() -> None:
    s = Supervision(RestartPolicy(backoff=0.1, crash_loop_limit=3, window=10))
    actions = [s.exited("worker", t).action for t in (0.0, 1.0, 2.0)]
    assert actions == [Action.RESTART] * 3
    fourth = s.exited("worker", 3.0)
    assert fourth.action is Action.GIVE_UP and fourth.exits == 4
    assert s.crash_looped and s.given_up == ["worker"]


def test_exits_older_than_the_window_are_forgiven() -> None:
    s = Supervision(RestartPolicy(backoff=0.5, crash_loop_limit=2, window=10))
    for t in (0.0, 20.0, 40.0, 60.0, 80.0):  # one exit every 20 s: never a loop
        d = s.exited("etcd", t)
        assert d.action is Action.RESTART and d.delay == 0.5 and d.exits == 1
    assert not s.crash_looped


def test_no_restart_leaves_every_exit_down_and_is_no_crash_loop() -> None:
    s = Supervision(RestartPolicy(restart=False, crash_loop_limit=1))
    assert [s.exited("c0", t).action for t in (0.0, 1.0, 2.0)] == [Action.LEAVE_DOWN] * 3
    assert not s.crash_looped


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RestartPolicy(backoff=5, backoff_max=1)
    with pytest.raises(ValueError):
        RestartPolicy(crash_loop_limit=0)


def test_describe_exit() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(None) == "still running"


# -- the adapter, over real processes ----------------------------------------------------

def _service(tmp_path: Path, name: str, code: str) -> Service:
    """Ready once it printed its first line."""
    log = tmp_path / name / f"{name}.log"
    return Service(name, [sys.executable, "-c", code], workdir=tmp_path / name, ready_timeout=10,
                   probe=lambda: log.read_text().count("\n") > 1)


def test_a_killed_member_is_reported_and_restarted_the_rest_untouched(tmp_path: Path) -> None:
    lines: list[str] = []
    sleeper = "print('sleeping', flush=True); import time; time.sleep(120)"
    a, b = _service(tmp_path, "a", sleeper), _service(tmp_path, "b", sleeper)
    try:
        a.start(), b.start()
        sup = Supervisor([a, b], RestartPolicy(backoff=0.05), lines.append)
        first, other = a.pid, b.pid
        a._signal_group(signal.SIGKILL)
        wait_for(lambda: (sup.tick(), any("is back" in ln for ln in lines))[1], timeout=15,
                 what="a restarted")
        assert a.running and a.pid != first and b.pid == other
        assert lines[0].startswith(f"member: a (pid {first}) killed by SIGKILL after ")
        assert "restarting in 0.05s" in lines[0] and "last log line: sleeping" in lines[0]
        assert not sup.crash_looped
    finally:
        a.stop(), b.stop()


def test_a_crash_looping_member_is_given_up_on_loudly(tmp_path: Path) -> None:
    lines: list[str] = []
    bad = Service("bad", [sys.executable, "-c",
                          "import sys; print('boom: no config', flush=True); sys.exit(3)"],
                  workdir=tmp_path / "bad", probe=lambda: False, ready_timeout=30)  # never ready
    try:
        bad.start(wait=False)
        sup = Supervisor([bad], RestartPolicy(backoff=0.01, backoff_max=0.02,
                                              crash_loop_limit=2, window=60), lines.append)
        wait_for(lambda: (sup.tick(), sup.crash_looped)[1], timeout=30, what="a crash loop")
        assert sup.crash_looped == ["bad"]
        assert [ln.split(":")[0] for ln in lines] == ["member", "member", "error"]
        assert "exit code 3" in lines[-1] and "crash loop: 3 exits" in lines[-1]
        assert "boom: no config" in lines[-1]
        for _ in range(5):  # given up: no more restarts
            sup.tick()
        assert not bad.running and len(lines) == 3
    finally:
        bad.stop()


def test_last_log_line(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("first\nsecond\n\n  \n--- quire: starting x\n")
    assert last_log_line(log) == "second"
    log.write_text("y" * 500)
    assert len(last_log_line(log, limit=100)) == 100
    assert last_log_line(tmp_path / "missing.log") == ""
