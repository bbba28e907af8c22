"""`quire up -n 4` as a supervisor, with the real processes: kill -9 of a replication-3
journal's primary moves the journal to a new primary that takes appends, while the
killed coordinator is restarted and rejoins (or, with --no-restart, stays down); and
output captured from a pipe keeps whole fragment names and paths on one line."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from protocol.config import Settings
from tools.local_cluster import STOP_BOUND
from tools.services import free_port

pytestmark = pytest.mark.timeout(240)

T = TypeVar("T")
FAILOVER_BOUND = Settings().lease_ttl_seconds + 40.0
"""Seconds to wait for a new primary and for the killed member to be listed again: its
lease's TTL (quire up's members keep the default), then the allocator's pass and the
route's sync — bounded generously, because each poll here is a CLI process and the whole
cluster shares the machine with the suite (a 30 s bound was overrun at load 12 under
stress-ng by a poll that began before it). How fast failover is, is measured by
`bench.scale --failover` (docs/reliability.md), not asserted here."""


def start_up(data: Path, *extra: str, json_out: bool = True) -> tuple[subprocess.Popen, dict]:
    argv = [sys.executable, "-m", "tools.cli.main", "up", "-n", "4", "--data-dir", str(data),
            "--port", str(free_port()), *extra] + (["-o", "json"] if json_out else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            out += os.read(proc.stdout.fileno(), 65536)
            if json_out and out.endswith(b"\n"):
                return proc, json.loads(out)
            if not json_out and b"Ctrl-C stops everything" in out:
                return proc, {"table": out.decode()}
    proc.kill()
    raise AssertionError(f"quire up did not come up: {proc.stderr.read().decode()[-2000:]}")


def stop_up(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        # quire up's own stop is bounded by STOP_BOUND (60 s: each phase SIGKILLs what
        # outlives it); waiting exactly that long raced it under load (stress run
        # 2026-11-29): the bound plus the process's own exit.
        code = proc.wait(STOP_BOUND + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return code, proc.stderr.read().decode()


def cli(broker: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUIRE_BROKER": broker}
    return subprocess.run([sys.executable, "-m", "tools.cli.main", "--timeout", "5", *args],
                          input=stdin, capture_output=True, env=env, timeout=60, check=False)


def until(what: str, condition: Callable[[], T], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.3)


def route(broker: str, journal: str) -> tuple[list[str], str | None]:
    listed = cli(broker, "journals", "list", "-o", "json")
    for line in listed.stdout.splitlines():
        row = json.loads(line)
        if row["spec"]["name"] == journal and row.get("route"):
            members = [m["suffix"] for m in row["route"]["members"]]
            primary = row["route"]["primary"]
            return members, members[primary] if 0 <= primary < len(members) else None
    return [], None


def primary_other_than(broker: str, journal: str, victim: str, *,
                       replica_too: bool = False) -> str | None:
    """The journal's primary once it is a full 3-member route led by another member
    (and, with `replica_too`, with the victim in no slot at all)."""
    members, primary = route(broker, journal)
    if len(members) != 3 or primary in (None, victim) or (replica_too and victim in members):
        return None
    return primary


def brokers(broker: str) -> set[str]:
    listed = cli(broker, "brokers", "list", "-o", "json")
    return {json.loads(line)["id"]["suffix"] for line in listed.stdout.splitlines()}


def apply_and_route(broker: str, store: str, tmp: Path, journal: str) -> str:
    spec = tmp / "spec.yaml"
    spec.write_text(f"name: {journal}\nreplication: 3\nfragment:\n  length: 1KiB\n"
                    f"  refresh_interval: 1s\n  stores: [{store}]\n")
    assert cli(broker, "journals", "apply", "-f", str(spec)).returncode == 0
    return until("a 3-member route", lambda: primary_other_than(broker, journal, ""), 30)


def append(broker: str, journal: str, data: bytes, timeout: float = 30) -> None:
    def attempt() -> bool:
        return cli(broker, "append", "-j", journal, stdin=data).returncode == 0

    until(f"an append to {journal}", attempt, timeout)


def kill_primary(info: dict, primary: str) -> float:
    pid = next(s["pid"] for s in info["services"] if s["service"] == primary)
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def test_kill_9_of_a_primary_fails_over_and_the_member_comes_back(tmp_path: Path) -> None:
    proc, info = start_up(tmp_path / "data")
    broker, journal = info["broker"], "up/failover"
    try:
        victim = apply_and_route(broker, info["store"], tmp_path, journal)
        before = b"".join(b"%04d" % i + b"x" * 595 + b"\n" for i in range(4))  # rolls at 1 KiB
        append(broker, journal, before)
        kill_primary(info, victim)
        # Restarted as soon as its old lease expired, the victim may be a replica again
        # by now, but the primary moved.
        until("a new primary", lambda: primary_other_than(broker, journal, victim), FAILOVER_BOUND)
        append(broker, journal, b"after failover\n", timeout=10)
        # The victim's old member key went with its lease (the primary moved): a listing
        # now is its new run, restarted by quire up.
        until(f"{victim} listed again", lambda: victim in brokers(broker), FAILOVER_BOUND)
        assert brokers(broker) == {f"coordinator-{i}" for i in range(4)}
        read = cli(broker, "read", "-j", journal)
        assert read.returncode == 0 and read.stdout == before + b"after failover\n", read.stderr
        # Piped (captured) table output holds a whole persisted fragment name on one line.
        frags = until("a persisted fragment", lambda: [
            f for f in map(json.loads, cli(broker, "fragments", "list", "-j", journal,
                                           "-o", "json").stdout.splitlines()) if f["persisted"]], 60)
        table = cli(broker, "fragments", "list", "-j", journal).stdout.decode()
        assert any(frags[0]["path"] in line for line in table.splitlines()), table
        assert frags[0]["path"].startswith(info["store"] + journal + "/")
    finally:
        code, err = stop_up(proc)
    assert code == 0, err
    assert f"member: {victim} (pid " in err and "killed by SIGKILL" in err, err
    assert f"member: {victim} is back" in err, err


def test_no_restart_leaves_the_killed_member_down_and_the_cluster_serves(tmp_path: Path) -> None:
    proc, info = start_up(tmp_path / "data", "--no-restart", json_out=False)
    table = info["table"]
    broker = table.split("export QUIRE_BROKER=")[1].split()[0]
    store = table.split("store: ")[1].split()[0]
    # Captured, not a tty: every log path of the table is whole on its line.
    for name in ("coordinator-0", "coordinator-3", "worker", "dashboard"):
        assert any(f"/logs/{name}/{name}.log" in line for line in table.splitlines()), table
    journal = "up/stays-moved"
    try:
        victim = apply_and_route(broker, store, tmp_path, journal)
        append(broker, journal, b"before\n")
        pid = int(next(line.split("│")[2] for line in table.splitlines()
                       if f" {victim} " in line))
        info = {"services": [{"service": victim, "pid": pid}]}
        kill_primary(info, victim)
        until("a new route without it", lambda: primary_other_than(
            broker, journal, victim, replica_too=True), FAILOVER_BOUND)
        append(broker, journal, b"after\n", timeout=10)
        assert brokers(broker) == {f"coordinator-{i}" for i in range(4)} - {victim}
        assert cli(broker, "read", "-j", journal).stdout == b"before\nafter\n"
    finally:
        code, err = stop_up(proc)
    assert code == 0, err  # left down by request: no crash loop
    assert f"member: {victim} (pid {pid}) killed by SIGKILL" in err, err
    assert "left down (--no-restart)" in err and "is back" not in err, err
