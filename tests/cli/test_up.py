"""`quire up`: a whole local cluster as subprocesses; a second run reuses the data dir."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tools.services import free_port

pytestmark = pytest.mark.timeout(300)


def start_up(data_dir: Path, port: int) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", "up", "-n", "2",
                             "--data-dir", str(data_dir), "--port", str(port), "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if line:
                return proc, json.loads(line)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"quire up did not come up: {proc.stderr.read().decode()[-2000:]}")


def stop_up(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def cli(info: dict, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUIRE_BROKER": info["broker"]}
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], input=stdin,
                          capture_output=True, env=env, timeout=60)


def test_up_runs_a_cluster_and_a_second_run_keeps_its_journals(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    proc, info = start_up(data, port)
    try:
        names = {s["service"] for s in info["services"]}
        assert {"etcd", "redis", "coordinator-0", "coordinator-1", "dashboard"} <= names
        assert "worker" in names  # workers/app.py exists in this tree
        with urllib.request.urlopen(info["dashboard"], timeout=10) as resp:  # the live dashboard
            assert resp.status == 200
        assert info["store"] == (data / "fragments").as_uri() + "/"
        specs = tmp_path / "s.yaml"
        specs.write_text(f"name: up/kept\nreplication: 2\nfragment:\n  length: 1KiB\n"
                         f"  refresh_interval: 1s\n  stores: [{info['store']}]\n")
        assert cli(info, "journals", "apply", "-f", str(specs)).returncode == 0
        lines = [b"%04d" % i + b"x" * 1095 + b"\n" for i in range(3)]
        deadline = time.monotonic() + 30
        for line in lines:
            while True:  # the first append waits for the allocator to assign a primary
                res = cli(info, "append", "-j", "up/kept", stdin=line)
                if res.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert res.returncode == 0, res.stderr
        # Fragments rolled at 1 KiB are persisted by the Celery worker into the store.
        persisted_end, deadline = 0, time.monotonic() + 60
        while persisted_end == 0 and time.monotonic() < deadline:
            frags = [json.loads(ln) for ln in cli(info, "fragments", "list", "-j", "up/kept",
                                                  "-o", "json").stdout.splitlines()]
            persisted_end = max((f["end"] for f in frags if f["persisted"]), default=0)
            time.sleep(0.5)
        assert persisted_end > 0, "nothing was persisted within 60s"
    finally:
        stopping = time.monotonic()
        assert stop_up(proc) == 0
    # Coordinators drain in parallel, within their bound (tools/local_cluster.py).
    assert time.monotonic() - stopping < 45
    # Everything it started is gone.
    leftovers = subprocess.run(["pgrep", "-f", str(data)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""

    proc, info2 = start_up(data, port)
    try:
        assert info2["etcd"] == info["etcd"]  # same ports, same etcd data
        listed = cli(info2, "journals", "list", "-o", "json")
        assert "up/kept" in listed.stdout.decode()
        # The first run drained on SIGTERM: the spools were rolled and persisted, and
        # each coordinator recorded its write head. Nothing was lost, and a plain append
        # continues at the old write head (no INDEX_HAS_GREATER_OFFSET, no reset-head).
        content = b"".join(lines)
        again = cli(info2, "append", "-j", "up/kept", stdin=b"again\n")
        assert again.returncode == 0, again.stderr
        everything = content + b"again\n"
        deadline = time.monotonic() + 30
        while True:
            read = cli(info2, "read", "-j", "up/kept")
            if len(read.stdout) >= len(everything) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert read.stdout == everything, read.stderr
        # The drain persisted the tail that had never been rolled (Redis starts empty, so
        # the index is rebuilt by the next sweep).
        persisted_end, deadline = 0, time.monotonic() + 60
        while persisted_end < len(content) and time.monotonic() < deadline:
            frags = [json.loads(ln) for ln in cli(info2, "fragments", "list", "-j", "up/kept",
                                                  "-o", "json").stdout.splitlines()]
            persisted_end = max((f["end"] for f in frags if f["persisted"]), default=0)
            time.sleep(0.5)
        assert persisted_end == len(content)
        # reset-head finds nothing to recover: the write head is already the journal's end.
        reset = cli(info2, "journals", "reset-head", "-j", "up/kept", "-o", "json")
        assert reset.returncode == 0, reset.stderr
        assert json.loads(reset.stdout)["write_head"] == len(everything)
    finally:
        assert stop_up(proc) == 0
