"""Caught crashes in quire's JSON logs: the exceptions a process caught where none was
expected, which it logs and survives.

A coordinator logs `log.exception(...)` where a bug must not take the process down (a
connection handler, a replicate channel, a pulse, an allocator pass, a keyspace
callback), and asyncio logs an exception that escaped a handler or a task. The process
carries on, so nothing else shows it: the test clusters (tests/coordinator/cluster.py)
and the chaos runs (chaos/ending.py) read their coordinators' logs with `crashes()`, and a
running cluster counts every error in quire_log_errors_total (protocol/logs.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CRASHES", "crashes"]

CRASHES = ("connection handler failed", "replicate channel failed",
           "replicate stream set-up failed", "pulse crashed", "allocator pass crashed",
           "keyspace on_change callback failed", "on_standing callback failed",
           "computing the persistence backlog failed")
"""Events of `log.exception` in coordinator/ and topology/: each a bug, whatever else
the run showed."""


def crashes(logs: Iterable[tuple[str, Path | str]]) -> list[str]:
    """Every caught crash in these (name, JSON log path) pairs, as `name: event:
    exception` (a missing or unreadable log has none)."""
    out: list[str] = []
    for name, path in logs:
        try:
            text = Path(path).read_bytes().decode(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            what = str(event.get("event", ""))
            if what.startswith(CRASHES) or (event.get("logger") == "asyncio"
                                            and event.get("level") == "error"):
                exc = (event.get("exception") or [{}])[0]
                out.append(f"{name}: {what.splitlines()[0]}: "
                           f"{exc.get('exc_type', '')} {exc.get('exc_value', '')}"[:300])
    return out
