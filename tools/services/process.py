"""Run real helper processes (etcd, redis-server, moto, Celery, coordinators).

A `Service` owns one subprocess in its own process group, a working directory
and a log file there. The subprocess dies with this process, however it ends —
SIGKILL included (a parent-death signal, tools/lifetime.py) — so no service
outlives the command or test that started it. Everything is bounded: readiness, stop and kill all give
up after a timeout and say why, with the tail of the service's own log, because
a hung or silent failure in a fixture is the most expensive bug to debug.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from tools.lifetime import ProcessIdentity, dying_with_us, identity_after_exec, spawn

__all__ = [
    "Service",
    "ServiceError",
    "free_port",
    "live_services",
    "kill_all",
    "pid_alive",
    "wait_for",
]


class ServiceError(RuntimeError):
    """A service failed to start, become ready or stop within its bound."""


# Ports handed out by this process: a port is handed out once, even before its service
# binds it, so two services of one process never collide.
_handed_out: set[int] = set()
_ports_lock = threading.Lock()
_LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_block(env: Mapping[str, str] = os.environ) -> range:
    """Where this process picks its ports: below the kernel's ephemeral range, because
    every outgoing connection takes its local port from that range — a port found free
    there (bind to port 0) can be taken by any client's connect before its service binds
    it — and, under pytest-xdist, a block of its own per worker, so that workers (and
    the processes they start, which inherit the variable) never pick the same one."""
    high = max(_LOWEST_PORT + 1000, _ephemeral_low())
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        size = (high - _LOWEST_PORT) // int(count)
        start = _LOWEST_PORT + (int(worker[2:]) % int(count)) * size
        return range(start, start + size)
    return range(_LOWEST_PORT, high)


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1, never handed out before by this
    process, from this process's block (port_block)."""
    block = port_block()
    with _ports_lock:
        for _ in range(256):
            port = random.randrange(block.start, block.stop)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use (or lingering): another
            _handed_out.add(port)
            return port
    raise ServiceError(f"no free loopback port in {block.start}-{block.stop - 1} after 256 attempts")


def pid_alive(pid: int) -> bool:
    """True if `pid` runs. Zombies count as dead: our PID 1 may never reap
    orphans, and a zombie holds no port, file or lock."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # The state letter follows the parenthesised command name, which may itself
    # contain spaces or parentheses, hence rpartition.
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def wait_for(
    condition: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll `condition` until it returns something truthy; return that value.

    Exceptions raised by `condition` count as "not yet" (a server that is still
    binding refuses connections); the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - see docstring
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{detail}")
        time.sleep(interval)


_registry: dict[int, Service] = {}
_registry_lock = threading.Lock()


def live_services() -> list[Service]:
    """Services started by this process that have not been stopped or killed."""
    with _registry_lock:
        return list(_registry.values())


def kill_all() -> list[Service]:
    """SIGKILL every live service; return the ones that were still running."""
    leftovers = live_services()
    for svc in leftovers:
        try:
            svc.kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
    return leftovers


atexit.register(kill_all)


class Service:
    """One subprocess with a workdir, a log file and a readiness probe.

    Use it directly with `argv` (and optionally `probe`), or subclass and
    override `build_argv()` and `probe()`. Ports and the workdir are fixed at
    construction so that `restart()` comes back at the same address with the
    same data, which is what etcd-restart and crash tests need.
    """

    ready_timeout: float = 30.0
    stop_timeout: float = 10.0

    def __init__(
        self,
        name: str,
        argv: Sequence[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        probe: Callable[[], bool] | None = None,
        ready_timeout: float | None = None,
        stop_timeout: float | None = None,
        netns: str | None = None,
    ) -> None:
        self.name = name
        self.netns = netns
        """A network namespace to run in (`ip netns exec`): a host of tools.hosts."""
        self._argv = list(argv) if argv is not None else None
        self._extra_env = dict(env or {})
        self._probe = probe
        if ready_timeout is not None:
            self.ready_timeout = ready_timeout
        if stop_timeout is not None:
            self.stop_timeout = stop_timeout
        self._owns_workdir = workdir is None
        if workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"quire-{name}-"))
        else:
            self.workdir = Path(workdir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.identity: ProcessIdentity | None = None
        """Who the current run is (pid, start time, executable): what a later process may
        check before it signals a pid it read from a file (tools/cluster_run.py)."""
        self.on_spawn: Callable[[Service], None] | None = None
        """Called after each start, once the process exists (LocalCluster records it)."""
        self._log_offset = 0
        self._paused = False

    # -- to override -------------------------------------------------------

    def build_argv(self) -> list[str]:
        if self._argv is None:
            raise TypeError(f"{type(self).__name__} needs argv or an override of build_argv()")
        return list(self._argv)

    def build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self._extra_env)
        return env

    def probe(self) -> bool:
        """True once the service answers. Called repeatedly; may raise."""
        return self._probe() if self._probe is not None else True

    def describe(self) -> str:
        """Where clients reach this service (for tables and error messages)."""
        return ""

    # -- lifecycle ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """How the last run ended (negative: killed by that signal); None while it runs
        or before it was ever started."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    def start(self, *, wait: bool = True) -> Self:
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.pid})")
        argv = self.build_argv()
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]  # exec: the pid stays ours
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            log.write(f"--- quire: starting {' '.join(argv)}\n".encode())
            log.flush()
            env = self.build_env()
            try:
                # Forked on a thread that lives as long as this process (lifetime.spawn):
                # the death signal fires when the thread that forked exits.
                self._proc = spawn(lambda: subprocess.Popen(
                    # SIGKILL when this process dies, even by SIGKILL.
                    dying_with_us(argv),
                    cwd=self.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Own session and process group: a signal to the group
                    # reaches every child (Celery pool processes, JVMs), and
                    # Ctrl-C at the terminal does not hit services mid-test.
                    start_new_session=True,
                ))
            except OSError as exc:
                raise ServiceError(f"{self.name}: cannot run {argv[0]!r}: {exc}") from exc
        # Popen returns once the child has exec'd: this is the program's identity.
        self.identity = identity_after_exec(self._proc.pid)
        self._paused = False
        with _registry_lock:
            _registry[self._proc.pid] = self
        if self.on_spawn is not None:
            self.on_spawn(self)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float | None = None) -> Self:
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        last_exc: BaseException | None = None
        while True:
            if not self.running:
                code = self._proc.returncode if self._proc is not None else None
                self._signal_group(signal.SIGKILL)  # children it may have left
                self._forget()
                raise ServiceError(
                    f"{self.name} exited with status {code} before it was ready\n"
                    f"{self.log_tail()}"
                )
            try:
                if self.probe():
                    return self
            except Exception as exc:  # noqa: BLE001 - not ready yet
                last_exc = exc
            if time.monotonic() >= deadline:
                detail = f"; last probe error: {last_exc!r}" if last_exc else ""
                # A service that never became ready is useless and would leak.
                self.kill()
                raise ServiceError(
                    f"{self.name} not ready after {timeout:g}s{detail}\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM the leader (graceful shutdown), SIGKILL the group after
        `timeout`. Returns the exit status, or None if it was not running."""
        proc = self._proc
        if proc is None:
            return None
        timeout = self.stop_timeout if timeout is None else timeout
        if proc.poll() is None:
            # Only the leader: Celery's warm shutdown drains its pool itself,
            # and a TERM straight to pool children would look like lost workers.
            self._signal_leader(signal.SIGTERM)
            if self._paused:
                self._signal_group(signal.SIGCONT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout)
        # Sweep anything the leader left behind in its group.
        self._signal_group(signal.SIGKILL)
        self._forget()
        return proc.returncode

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to the leader, as stop() does) without waiting: for
        callers that stop several services at once under one deadline; finish with
        stop() once it exited, or kill() when the deadline passed."""
        if self.running:
            self._signal_leader(signal.SIGTERM)
            if self._paused:
                self._signal_group(signal.SIGCONT)

    def kill(self) -> int | None:
        """SIGKILL the whole group, like a machine losing power."""
        proc = self._proc
        if proc is None:
            return None
        self._signal_group(signal.SIGKILL)
        try:
            proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(f"{self.name} (pid {proc.pid}) survived SIGKILL") from exc
        self._forget()
        return proc.returncode

    def pause(self) -> None:
        """SIGSTOP the group: the process keeps its sockets but stops answering."""
        self._require_running()
        self._signal_group(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        self._require_running()
        self._signal_group(signal.SIGCONT)
        self._paused = False

    def restart(self, *, wait: bool = True) -> Self:
        self.stop()
        return self.start(wait=wait)

    def close(self) -> None:
        """Stop, and remove the workdir if this service created it."""
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        where = self.describe()
        return f"<{type(self).__name__} {self.name} {state} pid={self.pid}{' ' + where if where else ''}>"

    # -- logs --------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines this run of the service wrote."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"
        tail = data.decode(errors="replace").splitlines()[-lines:]
        body = "\n".join(f"  | {line}" for line in tail) or "  | (empty)"
        return f"--- last lines of {self.log_path}:\n{body}"

    def log_text(self) -> str:
        """Everything this run of the service wrote so far."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    # -- internals ---------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running:
            raise ServiceError(f"{self.name} is not running")

    def _signal_leader(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            try:
                self._proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _forget(self) -> None:
        self._paused = False
        if self._proc is not None:
            with _registry_lock:
                _registry.pop(self._proc.pid, None)
