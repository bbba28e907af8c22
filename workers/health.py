"""Liveness: a task that proves a worker consumes its queue and can answer."""

from __future__ import annotations

import os
from typing import Any

from workers.app import app


@app.task(name="workers.health.ping", bind=True)
def ping(self: Any, payload: Any = None) -> dict[str, Any]:
    # The worker name and pid let a caller check which process answered.
    return {"pong": True, "echo": payload, "worker": self.request.hostname, "pid": os.getpid()}
