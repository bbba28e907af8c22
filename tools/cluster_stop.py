"""One bounded phase of a local cluster's stop (LocalCluster.stop), and what a stopped
coordinator's drain did: its own drain lines (coordinator/drain.py logs them, JSON or
console) and what its spool directory still holds."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.services import Service, ServiceError

__all__ = ["drain_outcome", "spool_usage", "stop_phase"]

NOTE_EVERY = 10.0
"""Seconds between two "still waiting for …" lines while a phase lasts."""


def stop_phase(services: list[Service], bound: float, say: Callable[[str], None],
               hurry: threading.Event, errors: list[str], doing: str = "",
               spools: dict[str, Path] | None = None) -> None:
    """SIGTERM `services` at once, wait for them (at most `bound` seconds, cut short
    when `hurry` is set), SIGKILL whoever is left; say how each one ended and, for a
    coordinator (its spool directory in `spools`), what its drain left on disk."""
    services = [s for s in services if s.pid is not None]
    if not services:
        return
    started = time.monotonic()
    for svc in services:
        svc.terminate()
    deadline, note = started + bound, started + NOTE_EVERY
    pending = list(services)

    def done(svc: Service, killed: bool) -> None:
        """Say how `svc` ended (as soon as it did: a quick member is not reported with a
        slow one's time) and sweep its process group."""
        pending.remove(svc)
        pid, took = svc.pid, time.monotonic() - started
        try:
            if killed:
                svc.kill()
            else:
                svc.stop(timeout=1.0)  # exited: sweep its process group, forget it
        except ServiceError as exc:
            errors.append(str(exc))
            return
        how = (f"did not stop within {took:.0f}s{' (stop hurried)' if hurry.is_set() else ''}: "
               f"killed" if killed else f"stopped ({took:.1f}s)")
        spool = (spools or {}).get(svc.name)
        say(f"{svc.name} (pid {pid}) {how}{drain_report(svc, spool, killed) if spool else ''}")

    while pending:
        for svc in [s for s in pending if not s.running]:
            done(svc, killed=False)
        now = time.monotonic()
        if not pending or hurry.is_set() or now >= deadline:
            break
        if now >= note:
            note += NOTE_EVERY
            say(f"stopping: still waiting for {', '.join(s.name for s in pending)} "
                f"({now - started:.0f}s of at most {bound:g}s{'; ' + doing if doing else ''})")
        hurry.wait(0.05)
    for svc in list(pending):
        done(svc, killed=svc.running)


def drain_report(svc: Service, spool: Path, killed: bool) -> str:
    """What a coordinator's drain left on disk: its own last word on it and the spool
    files in its spool directory."""
    files, size = spool_usage(spool)
    disk = (f"{files} spool file{'s' if files != 1 else ''} ({size} bytes) in {spool}"
            if files else f"no spool files in {spool}")
    if killed:
        return (f"; its drain did not finish: {disk}, kept and offered to the workers again "
                f"by the next quire up")
    return f"; drain: {drain_outcome(svc)}; left on disk: {disk}"

_UNPERSISTED = "exiting before the index showed these fragments persisted"
_PERSISTED = "fragments of led journals persisted before exit"
_IN_FLIGHT = "appends still in flight at shutdown"


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        elif any(key in line for key in (_UNPERSISTED, _PERSISTED, _IN_FLIGHT)):
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            out.append({"event": line, **fields})
    return out


def drain_outcome(svc: Any) -> str:
    """One phrase from the coordinator's log of this run: how its drain ended."""
    try:
        text = svc.log_text()
    except OSError:
        return ""
    said = []
    for event in _events(text):
        what = str(event.get("event", ""))
        if _UNPERSISTED in what:
            said.append(f"{event.get('count', '?')} fragment(s), {event.get('bytes', '?')} bytes, "
                        f"not shown persisted before it exited (they stay in its spool and are "
                        f"offered to the workers again at the next start)")
        elif _PERSISTED in what:
            said.append(f"{event.get('count', '?')} fragment(s) of the journals it led persisted")
        elif _IN_FLIGHT in what:
            said.append(f"{event.get('count', '?')} append(s) still in flight were rolled back")
    return "; ".join(said) or "nothing to persist"


def spool_usage(spool: Path) -> tuple[int, int]:
    """(files, bytes) of fragment content under a spool directory (dot-files — the
    recorded write heads — aside)."""
    files = size = 0
    if not spool.is_dir():
        return 0, 0
    for path in spool.rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            try:
                size += path.stat().st_size
            except OSError:
                continue
            files += 1
    return files, size
