"""Issue #51, case 3: every cluster a command starts stops with it.

`quire up` and `quire bench` (its smallest form) are killed with SIGKILL and with
SIGTERM; the process tree recorded just before the kill (every descendant, by pid and
start time) is gone 5 s after the command is. The next `quire up` in a data dir reaps
what the last one left: a leftover is simulated honestly — the death signal already
kills every member of a SIGKILLed `quire up`, so a member-like process of that data
dir is started directly and recorded as the last run records its members — and a
recorded pid that now belongs to a stranger is left alone. One bounded stop phase:
a member that ignores SIGTERM is killed at its bound and said to be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tools.cluster_run import read_state
from tools.cluster_stop import stop_phase
from tools.lifetime import ProcessIdentity
from tools.local_cluster import STOP_BOUND
from tools.services import QuireUpService, Service, free_port, wait_for

pytestmark = pytest.mark.timeout(600)

GONE_WITHIN = 5.0
"""Seconds after the command ended by which none of its processes may be left."""


def descendants(pid: int) -> list[ProcessIdentity]:
    """Every live descendant of `pid` (children, their children, …) with its identity."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        ident = ProcessIdentity.of(p)
        if ident is not None:
            out.append(ident)
        todo += children.get(p, [])
    return out


def left(tree: list[ProcessIdentity]) -> list[str]:
    return [i.describe() for i in tree if i.current() is not None]


def assert_all_gone(tree: list[ProcessIdentity], what: str) -> None:
    try:
        wait_for(lambda: not left(tree), timeout=GONE_WITHIN, what=f"every process of {what} to be gone")
    except TimeoutError:
        raise AssertionError(f"{what} left running: {left(tree)}") from None


def cmdlines(tree: list[ProcessIdentity]) -> str:
    return "\n".join(" ".join(i.cmdline) for i in tree)


# -- quire up -----------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_quire_up_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    up = QuireUpService(tmp_path / "data", "-n", "2", env={"QUIRE_DATA_DIR": ""})
    try:
        up.start()
        tree = descendants(up.pid)
        text = cmdlines(tree)
        for member in ("etcd", "redis-server", "coordinator-0", "coordinator-1", "worker", "beat",
                       "dashboards.main"):
            assert member in text, f"{member} not among quire up's processes:\n{text}"
        os.kill(up.pid, sig)
        wait_for(lambda: not up.running, timeout=STOP_BOUND + 15, what="quire up to exit")
        assert_all_gone(tree, f"quire up after {sig.name}")
        if sig is signal.SIGTERM:
            log = up.log_text()
            assert f"stopping… (at most {STOP_BOUND:g}s" in log, log[-3000:]
            for name in ("coordinator-0", "coordinator-1", "worker", "beat", "dashboard", "redis", "etcd"):
                assert f"\n{name} (pid " in log, f"no word on how {name} stopped:\n{log[-3000:]}"
            assert "drain: " in log and "left on disk: " in log, log[-3000:]
            assert up.returncode == 0
            assert not (tmp_path / "data" / "run" / "up.json").exists()
    finally:
        up.kill()


def test_sigterm_while_starting_stops_what_was_started(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = QuireUpService(data, "-n", "2", env={"QUIRE_DATA_DIR": ""})
    try:
        up.start(wait=False)
        members = data / "run" / "members.json"

        def started() -> list[ProcessIdentity]:  # etcd and Redis up, the rest still to come
            names = set(json.loads(members.read_text())["members"])
            return descendants(up.pid) if {"etcd", "redis"} <= names else []

        tree = wait_for(started, timeout=120, what="quire up to have started etcd and Redis")
        state = read_state(data)
        assert state is not None and state.state == "starting"
        os.kill(up.pid, signal.SIGTERM)
        wait_for(lambda: not up.running, timeout=STOP_BOUND + 15, what="quire up to exit")
        assert_all_gone(tree + [i for i in descendants(up.pid) if i not in tree],
                        "quire up after SIGTERM while starting")
        assert up.returncode == 130 and "interrupted while starting" in up.log_text(), up.log_text()[-3000:]
        assert read_state(data) is None
    finally:
        up.kill()


# -- quire bench --------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_quire_bench_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    tmp = tmp_path / "tmp"  # where bench makes its work dir
    tmp.mkdir()
    bench = Service("bench", [sys.executable, "-m", "tools.cli.main", "bench", "--quick", "--no-peers"],
                    env={"TMPDIR": str(tmp)}, workdir=tmp_path / "bench")
    try:
        bench.start()
        # Killed once its cluster runs — etcd and three coordinators, as reported — and
        # the three processes of its reference pipeline (multiprocessing children) are
        # serving: its first case has been measured.
        def running() -> list[ProcessIdentity]:
            if "pipeline R=3" not in bench.log_text():
                return []
            t = descendants(bench.pid)
            count = lambda word: sum(word in " ".join(i.cmdline) for i in t)  # noqa: E731
            return t if count("coordinator.main") >= 3 and count("spawn_main") >= 3 else []

        tree = wait_for(running, timeout=400, interval=0.5, what="quire bench's cluster")
        assert "etcd" in cmdlines(tree)
        os.kill(bench.pid, sig)
        wait_for(lambda: not bench.running, timeout=120, what="quire bench to exit")
        tree += [i for i in descendants(bench.pid or 0) if i not in tree]
        assert_all_gone(tree, f"quire bench after {sig.name}")
        if sig is signal.SIGTERM:  # stopped as Ctrl-C stops it: its work dir removed too
            assert not list(tmp.glob("quire-bench-*")), list(tmp.iterdir())
    finally:
        bench.kill()


# -- the next quire up reaps ---------------------------------------------------------------

def test_next_quire_up_reaps_what_the_last_left(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = QuireUpService(data, env={"QUIRE_DATA_DIR": ""})
    try:
        first.start()
        ports = json.loads((data / "cluster.json").read_text())
        record = json.loads((data / "run" / "members.json").read_text())
        assert {"etcd", "redis", "coordinator-0"} <= set(record["members"])
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: not first.running, timeout=10, what="quire up to die")
    finally:
        first.kill()
    # The leftover: a redis-server of this data dir on its port, in its own session, as a
    # member whose death signal never came (recorded as the last run records members);
    # and a member's child whose leader is gone, still in the member's process group.
    env = {**os.environ, "QUIRE_UP_RUN": record["run"], "QUIRE_DATA_DIR": str(data)}
    redis = subprocess.Popen(["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                              "--save", "", "--dir", str(tmp_path)], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    leader = subprocess.Popen(["bash", "-c", "sleep 300 & echo $! > child.pid; read x"], cwd=tmp_path,
                              env=env, start_new_session=True, stdin=subprocess.PIPE)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    up = None
    try:
        wait_for(lambda: (tmp_path / "child.pid").read_text().strip().isdigit(), timeout=10,
                 what="the member's child")
        child = int((tmp_path / "child.pid").read_text())
        leader_ident = ProcessIdentity.of(leader.pid)
        leader.stdin.close()  # the leader exits; its child stays in its group
        leader.wait(10)
        redis_ident, stranger_ident = ProcessIdentity.of(redis.pid), ProcessIdentity.of(stranger.pid)
        assert redis_ident and leader_ident and stranger_ident
        # The stranger's pid is recorded, as a pid reused since: another start time.
        reused = {**stranger_ident.to_json(), "start": stranger_ident.start - 1}
        (data / "run" / "members.json").write_text(json.dumps({"run": record["run"], "members": {
            "redis": redis_ident.to_json(), "worker": leader_ident.to_json(), "beat": reused}}))
        wait_for(lambda: ProcessIdentity.of(child) is not None, timeout=5, what="the child")

        up = QuireUpService(data, env={"QUIRE_DATA_DIR": ""}, port=first.port)
        up.start()
        log = up.log_text()
        assert "note: reaped" in log and f"redis (pid {redis.pid}" in log, log[-3000:]
        assert f"worker's child (pid {child}" in log, log[-3000:]
        assert redis.poll() is not None and ProcessIdentity.of(child) is None
        assert stranger.poll() is None, "a stranger whose pid was recorded was killed"
        # Reaped before the ports were chosen: the cluster keeps its Redis port.
        assert up.variables["QUIRE_REDIS_URL"] == f"redis://127.0.0.1:{ports['redis']}/0"
    finally:
        for p in (redis, stranger):
            p.kill()
            p.wait(10)
        if up is not None:
            up.stop()


def test_a_second_quire_up_in_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    from tools.cluster_run import RunDir

    data = tmp_path / "data"
    held = RunDir(data)
    held.acquire()  # as a running quire up holds it
    held.set_state("up")
    try:
        out = subprocess.run([sys.executable, "-m", "tools.cli.main", "up", "--data-dir", str(data),
                              "--port", str(free_port())], capture_output=True, text=True, timeout=120)
        assert out.returncode == 6, out.stderr
        assert f"quire up (pid {os.getpid()}, up) already runs a cluster in {data}" in out.stderr
    finally:
        held.release()


# -- one stop phase ------------------------------------------------------------------------

def ignores_sigterm(pid: int) -> bool:
    """Whether `pid` has SIGTERM ignored yet (bit 15 of its SigIgn mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def stubborn_member(workdir: Path) -> Service:
    """A member that ignores SIGTERM — returned only once its trap is in place, so a stop
    that begins at once cannot reach bash before the trap does (seen once in CI)."""
    stubborn = Service("stubborn", ["bash", "-c", "trap '' TERM; sleep 300 & wait"],
                       workdir=workdir).start()
    wait_for(lambda: ignores_sigterm(stubborn.pid or 0), timeout=10, what="the stubborn member's TERM trap")
    return stubborn


def test_a_member_past_its_bound_is_killed_and_said_to_be(tmp_path: Path) -> None:
    stubborn = stubborn_member(tmp_path / "s")
    polite = Service("polite", ["sleep", "300"], workdir=tmp_path / "p").start()
    said: list[str] = []
    errors: list[str] = []
    stop_phase([stubborn, polite], 1.0, said.append, threading.Event(), errors)
    assert not stubborn.running and not polite.running and not errors
    assert any(s.startswith("stubborn (pid ") and "did not stop within 1s: killed" in s for s in said), said
    assert any(s.startswith("polite (pid ") and "stopped (" in s for s in said), said


def test_hurry_cuts_a_phase_short(tmp_path: Path) -> None:
    stubborn = stubborn_member(tmp_path / "s")
    hurry = threading.Event()
    hurry.set()  # a second Ctrl-C before the phase began
    said: list[str] = []
    stop_phase([stubborn], 600.0, said.append, hurry, [])
    assert not stubborn.running
    assert "(stop hurried): killed" in said[0], said
