"""tools/log_crashes.py: which logged events are caught crashes (a bug each)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.log_crashes import crashes


def _line(**event: object) -> str:
    return json.dumps(event)


def test_caught_crashes_and_asyncio_errors_count_other_errors_do_not(tmp_path: Path) -> None:
    log = tmp_path / "c0.log"
    log.write_text("\n".join([
        "--- quire: starting python -m coordinator.main",  # the supervisor's header
        _line(event="connection handler failed", level="error", logger="coordinator.server",
              exception=[{"exc_type": "TypeError", "exc_value": "None object expected"}]),
        _line(event="frame connection handler failed\nprotocol: <...>", level="error",
              logger="asyncio", exception=[{"exc_type": "RuntimeError", "exc_value": "closed"}]),
        _line(event="membership lost", level="error", logger="topology.membership"),
        _line(event="pipeline broken", level="warning", logger="coordinator.pipeline"),
        "{not json",
    ]) + "\n")
    assert crashes([("c0", log), ("gone", tmp_path / "missing.log")]) == [
        "c0: connection handler failed: TypeError None object expected",
        "c0: frame connection handler failed: RuntimeError closed",
    ]
