"""Child processes that never outlive the command that started them.

Three pieces, used by tools/services/process.py (every `Service`), the bench and demo
launchers, and tools/cluster_run.py (what `quire up` leaves in its data dir):

* `dying_with_us(argv)`: the command run so that the kernel (prctl PR_SET_PDEATHSIG,
  kept across exec) SIGKILLs it when its parent dies — also on SIGKILL of the parent,
  where no Python code runs. util-linux's `setpriv --pdeathsig KILL` sets it and execs
  the program; not a `preexec_fn`, because Python code run in a child forked from a
  process with other threads (gRPC's) can crash or deadlock before exec — a test member
  died with SIGSEGV that way — while without one Popen forks with vfork and runs no
  Python in the child. The signal is tied to the *thread* that forked, not the process,
  so every fork must come from a thread that lives as long as the process: `spawn()`
  runs the fork on the main thread when called there, else on one long-lived spawner
  thread (never on a pool thread: asyncio.to_thread's and Celery's come and go).
* `die_with_parent()`: the same, called by a child itself (multiprocessing children).
* `ProcessIdentity`: a pid plus what makes it one process and not a later one that got
  the same number — the boot, the start time in clock ticks since boot, the executable —
  and its command line for messages. Title-rewriting programs (redis-server, Celery)
  change their cmdline after start, so the match is boot + start time + executable.

Linux only; elsewhere the death signal is skipped (and `cluster_run` reaps instead).
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ProcessIdentity", "die_with_parent", "dying_with_us", "group_members",
           "identity_after_exec", "interrupt_on_sigterm", "process_group", "spawn"]

T = TypeVar("T")
PR_SET_PDEATHSIG = 1

try:  # resolved once, here: the forked child only calls the function
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send `sig` to this process when its parent (the thread that
    forked it) exits. If the parent is already gone (`parent` given and no longer our
    parent: we were re-parented before the call), take the signal now. False where
    the kernel has no such thing."""
    if _prctl is None or _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


_SETPRIV = shutil.which("setpriv") if _prctl is not None else None


def dying_with_us(argv: Sequence[str]) -> list[str]:
    """`argv` run so that it gets SIGKILL when the thread that starts it exits (module
    doc). Start it through `spawn()` (or from the main thread); unchanged where there
    is no setpriv (not Linux: `cluster_run` reaps instead)."""
    if _SETPRIV is None:
        return list(argv)
    # What Popen would raise for the program itself (setpriv would only exit 127).
    program = argv[0]
    if not (os.access(program, os.X_OK) if os.sep in program else shutil.which(program)):
        raise FileNotFoundError(errno.ENOENT, "no such executable", program)
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def identity_after_exec(pid: int, timeout: float = 5.0) -> ProcessIdentity | None:
    """The identity of a child started with `dying_with_us`, once setpriv has exec'd the
    program (microseconds after Popen returns)."""
    deadline = time.monotonic() + timeout
    setpriv = os.path.realpath(_SETPRIV) if _SETPRIV else None
    while True:
        ident = ProcessIdentity.of(pid)
        if ident is None or ident.exe != setpriv or time.monotonic() > deadline:
            return ident
        time.sleep(0.001)


class _Spawner:
    """One daemon thread that lives as long as the process and runs forks for others."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="quire-spawner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T]) -> T:
        fut: Future[T] = Future()
        self._jobs.put((fn, fut))
        return fut.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(fn: Callable[[], T]) -> T:
    """Run `fn` (which forks, e.g. a Popen of `dying_with_us(argv)`) on a thread that
    lives as long as this process: the caller's, if it is the main thread, else the
    spawner thread — so a child's death signal fires when the process ends, never
    when a short-lived worker thread does."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    return _spawner.call(fn)


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does, so a
    command's `finally` and `with` blocks stop what it started (Python's default on
    SIGTERM is to die at once, leaving every `finally` unrun)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


# -- identity -----------------------------------------------------------------------------

def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from the state on (field 3 is index 0)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def process_group(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields else None


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start: int
    """Start time, clock ticks since boot (/proc/<pid>/stat field 22)."""
    exe: str
    boot: str
    cmdline: tuple[str, ...] = ()

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of running process `pid` (None if gone, a zombie or unreadable)."""
        fields = _stat(pid)
        if not fields or fields[0] in ("Z", "X"):
            return None
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        cmdline = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        return cls(pid, int(fields[19]), exe, _boot_id(), cmdline)

    def current(self) -> ProcessIdentity | None:
        """The live process with this identity, or None: gone, or its pid now belongs
        to another process (different start time, executable or boot)."""
        now = ProcessIdentity.of(self.pid)
        if now is None or (now.start, now.exe, now.boot) != (self.start, self.exe, self.boot):
            return None
        return now

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "exe": self.exe, "boot": self.boot,
                "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcessIdentity:
        return cls(int(d["pid"]), int(d["start"]), str(d["exe"]), str(d["boot"]),
                   tuple(d.get("cmdline") or ()))

    def describe(self) -> str:
        return f"pid {self.pid} ({' '.join(self.cmdline)[:80] or self.exe})"


def group_members(pgid: int, since: int, boot: str, marker: str) -> list[ProcessIdentity]:
    """Live processes of process group `pgid` started at or after `since` (clock ticks)
    on boot `boot` whose environment holds `marker` ("QUIRE_UP_RUN=…"): what a
    member whose leader is gone left in its group, and nothing else."""
    if boot != _boot_id():
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat(pid)
        if not fields or fields[0] in ("Z", "X") or int(fields[2]) != pgid or int(fields[19]) < since:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in environ:
            ident = ProcessIdentity.of(pid)
            if ident is not None:
                found.append(ident)
    return found
