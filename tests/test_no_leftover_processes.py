"""tools.services never leaves a process behind: stop, kill, failed
readiness, process groups and interpreter exit are all covered."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeout
from redis.retry import Retry

from tools.services import (
    RedisService,
    Service,
    ServiceError,
    live_services,
    pid_alive,
    wait_for,
)


def shell_service(name: str, script: str, workdir: Path) -> Service:
    # Ready once the script has written the pid of its child to child.pid.
    pidfile = workdir / "child.pid"
    return Service(
        name,
        ["bash", "-c", script],
        workdir=workdir,
        probe=lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(),
        ready_timeout=10,
    )


def child_pid(svc: Service) -> int:
    return int((svc.workdir / "child.pid").read_text())


def test_stop_reaps_and_unregisters() -> None:
    svc = RedisService("redis-leak-check").start()
    pid = svc.pid
    assert pid is not None and pid_alive(pid) and svc in live_services()
    assert svc.stop() == 0  # graceful: redis exits 0 on SIGTERM
    assert not pid_alive(pid) and svc not in live_services()
    svc.close()
    assert not svc.workdir.exists()


def test_kill_takes_the_whole_process_group(tmp_path: Path) -> None:
    svc = shell_service("group", "sleep 300 & echo $! > child.pid; wait", tmp_path).start()
    leader, child = svc.pid, child_pid(svc)
    assert leader is not None and pid_alive(child)
    svc.kill()
    assert not pid_alive(leader)
    wait_for(lambda: not pid_alive(child), timeout=5, what=f"child {child} to die")
    svc.close()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    # Ignored signals stay ignored across exec, so the child ignores TERM too.
    script = "trap '' TERM; sleep 300 & echo $! > child.pid; wait"
    svc = shell_service("stubborn", script, tmp_path)
    svc.start()
    child = child_pid(svc)
    assert svc.stop(timeout=0.5) == -9
    wait_for(lambda: not pid_alive(child), timeout=5, what=f"child {child} to die")
    svc.close()


def test_pause_and_resume() -> None:
    with RedisService("redis-pause") as svc:
        svc.pause()
        no_retry = Retry(NoBackoff(), 0)
        with svc.client(socket_timeout=0.3, retry=no_retry) as r, pytest.raises(RedisTimeout):
            r.ping()
        svc.resume()
        with svc.client(socket_timeout=5) as r:
            assert r.ping()
        svc.pause()  # stop() must also work on a stopped-by-signal process
    assert svc not in live_services()


def test_early_exit_reports_the_log_tail() -> None:
    script = "echo 'bad flag --frobnicate' >&2; exit 3"
    svc = Service("crasher", ["bash", "-c", script], probe=lambda: False)
    with pytest.raises(ServiceError, match=r"(?s)exited with status 3.*bad flag --frobnicate"):
        svc.start()
    assert svc not in live_services()
    svc.close()


def test_readiness_timeout_kills_the_process() -> None:
    svc = Service("never-ready", ["sleep", "300"], probe=lambda: False, ready_timeout=0.5)
    with pytest.raises(ServiceError, match="not ready after 0.5s"):
        svc.start()
    assert svc.pid is not None and not pid_alive(svc.pid)
    assert svc not in live_services()
    svc.close()


def test_missing_binary_is_a_service_error() -> None:
    svc = Service("nothing", ["/nonexistent/quire-binary"])
    with pytest.raises(ServiceError, match="cannot run"):
        svc.start()
    svc.close()


def test_atexit_kills_what_the_program_forgot(tmp_path: Path) -> None:
    # A program that starts a service and exits without stopping it.
    script = textwrap.dedent(
        """
        from tools.services import Service
        svc = Service("forgotten", ["sleep", "300"]).start()
        print(svc.pid, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(out.stdout.strip())
    wait_for(lambda: not pid_alive(pid), timeout=5, what=f"forgotten pid {pid} to die")


def test_sigkill_of_the_program_takes_its_services_even_from_short_lived_threads() -> None:
    # A program SIGKILLed (no atexit, no finally) after starting services from the main
    # thread, from a thread that has exited since, and from asyncio.to_thread: the
    # kernel's parent-death signal still kills each (tools/lifetime.py).
    script = textwrap.dedent(
        """
        import asyncio, os, signal, sys, threading, time
        from tools.services import Service
        pids = [Service("main", ["sleep", "300"]).start().pid]
        def in_thread(): pids.append(Service("thread", ["sleep", "300"]).start().pid)
        t = threading.Thread(target=in_thread); t.start(); t.join()
        async def main():
            return await asyncio.to_thread(lambda: Service("pool", ["sleep", "300"]).start().pid)
        pids.append(asyncio.run(main()))  # the loop's executor threads are gone after this
        time.sleep(0.5)
        from tools.services import pid_alive
        assert all(pid_alive(p) for p in pids), "a service died with the thread that started it"
        print(*pids, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == -9, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=5,
             what=f"services {pids} of a SIGKILLed program to die")
