"""What a running `quire up` keeps under `<data-dir>/run/`, so that nothing it started
can outlive it unnoticed, and a second terminal can tell "starting" from "not running".

* `lock`: held (flock) by the one `quire up` of this data dir for as long as it runs.
  The kernel drops it when that process ends, however it ends (SIGKILL included), and
  children do not inherit it. A second `quire up` in the same data dir is refused.
* `up.json`: that `quire up`'s identity (pid, start time, executable) and its state —
  starting, up, stopping; `quire env` reads it (`describe_state`).
* `members.json`: the identity of every member it started, rewritten at each (re)start.

Members die with their `quire up` (a parent-death signal, tools/lifetime.py). Should
one survive anyway — a machine without the signal, a member's child that escaped it —
the next `quire up` in the data dir, holding the lock, reaps what the last one
recorded (`RunDir.reap`): a recorded pid is signalled only while it is still the same
process (same boot, start time and executable); the rest of a member's process group
only for processes started after the member whose environment carries that run's own
token (QUIRE_UP_RUN, which `quire up` gives its members and nothing else has). A pid
that now belongs to a stranger is left alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.lifetime import ProcessIdentity, group_members, process_group

__all__ = ["AlreadyRunning", "Reaped", "RunDir", "UpState", "describe_state", "read_state"]

REAP_TIMEOUT = 5.0
"""Seconds a SIGKILLed leftover gets to be gone before the reap reports it."""


class AlreadyRunning(RuntimeError):
    """Another live `quire up` holds this data dir."""


@dataclass(frozen=True)
class Reaped:
    name: str
    ident: ProcessIdentity


@dataclass(frozen=True)
class UpState:
    ident: ProcessIdentity
    state: str
    since: float
    """Wall-clock time the state was entered."""


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class RunDir:
    """`<data-dir>/run/` of the `quire up` (this process) that holds its lock."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / "run"
        self._fd: int | None = None
        self.token = secrets.token_hex(8)
        """This run's QUIRE_UP_RUN: in every member's environment, nowhere else."""

    def acquire(self) -> None:
        """Take the data dir, or raise AlreadyRunning naming the `quire up` that has it."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            other = read_state(self.data_dir)
            who = f"quire up (pid {other.ident.pid}, {other.state})" if other else "another quire up"
            raise AlreadyRunning(f"{who} already runs a cluster in {self.data_dir}: stop it "
                                 f"first, or use another --data-dir") from None
        self._fd = fd

    def release(self) -> None:
        (self.path / "up.json").unlink(missing_ok=True)
        (self.path / "members.json").unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def set_state(self, state: str) -> None:
        ident = ProcessIdentity.of(os.getpid())
        if ident is not None and self.held:
            _write_json(self.path / "up.json", {"up": ident.to_json(), "state": state,
                                                "since": time.time()})

    def record(self, members: dict[str, ProcessIdentity]) -> None:
        """The members now running (name -> identity), replacing the last record."""
        if self.held:
            _write_json(self.path / "members.json", {
                "run": self.token, "members": {n: i.to_json() for n, i in members.items()}})

    def reap(self) -> list[Reaped]:
        """SIGKILL what the last `quire up` of this data dir recorded and left running
        (only ever called holding the lock: that one is gone). Returns what was killed."""
        assert self.held, "reap only while holding the data dir's lock"
        recorded = _read_json(self.path / "members.json")
        if not isinstance(recorded, dict) or not isinstance(recorded.get("members"), dict):
            return []
        marker = f"QUIRE_UP_RUN={recorded.get('run')}"
        victims: list[Reaped] = []
        for name, raw in recorded["members"].items():
            try:
                rec = ProcessIdentity.from_json(raw)
            except (KeyError, TypeError, ValueError):
                continue
            live = rec.current()
            if live is not None:  # still that very process: its group is ours too
                victims.append(Reaped(name, live))
                if process_group(rec.pid) == rec.pid:
                    _kill_group(rec.pid)
                else:
                    _kill(rec.pid)
            # Whatever else is in its group (its leader gone or not), if it is ours.
            for child in group_members(rec.pid, rec.start, rec.boot, marker):
                if child.pid != rec.pid and child.current() is not None:
                    victims.append(Reaped(f"{name}'s child", child))
                    _kill(child.pid)
        deadline = time.monotonic() + REAP_TIMEOUT
        while any(v.ident.current() for v in victims) and time.monotonic() < deadline:
            time.sleep(0.05)
        (self.path / "members.json").unlink(missing_ok=True)
        return victims


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_state(data_dir: Path) -> UpState | None:
    """The `quire up` running in `data_dir` and its state, or None when none runs (no
    record, or the recorded process is gone or is another process now)."""
    raw = _read_json(Path(data_dir) / "run" / "up.json")
    if not isinstance(raw, dict):
        return None
    try:
        ident = ProcessIdentity.from_json(raw["up"]).current()
        state, since = str(raw["state"]), float(raw["since"])
    except (KeyError, TypeError, ValueError):
        return None
    return UpState(ident, state, since) if ident is not None else None


def describe_state(up: UpState) -> str:
    age = max(0.0, time.time() - up.since)
    return f"quire up (pid {up.ident.pid}) is {up.state} ({age:.0f}s so far)"
