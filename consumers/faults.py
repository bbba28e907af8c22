"""Fault points: a real kill -9 of a consumer member at a chosen moment (tests, chaos).

`QUIRE_CONSUMER_FAULT=<point>@<n>` makes the process SIGKILL itself the n-th time it
reaches `fault_point(<point>)`. Points (runner.py): `after-commit` — a transaction's
write batch is durable (recovery log + store) and none of its outputs was appended;
`after-outputs` — its outputs were all acknowledged. Unset (always, in production):
one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "fault_point"]

FAULT_ENV = "QUIRE_CONSUMER_FAULT"
_counts: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Tests: `QUIRE_CONSUMER_FAULT=<name>@<n>` makes this process SIGKILL itself the n-th
    time it reaches the point `name` (a real kill -9 at a chosen moment, nothing mocked)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    want, _, nth = spec.partition("@")
    if want != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == int(nth or 1):
        os.write(2, f"fault point {name}@{_counts[name]}: SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)

