"""Journals on the session's stream cluster, for the streaming source and sink tests."""

from __future__ import annotations

import json
import time
from typing import Any

from protocol import Codec, FragmentSpec, JournalSpec, LabelSet


def make_journals(client: Any, store_url: str, names: list[str], *, length: int = 2048,
                  **labels: str) -> None:
    """Create journals (replication 1, small gzip fragments persisted to `store_url`)
    and wait until each takes appends."""
    client.apply([JournalSpec(
        name=j, replication=1, labels=LabelSet.of(**labels),
        fragment=FragmentSpec(length=length, compression_codec=Codec.GZIP,
                              stores=(store_url,), refresh_interval=1.0))
        for j in names])
    client.wait_writable(names)


def message(journal: str, n: int) -> bytes:
    return json.dumps({"j": journal, "n": n, "pad": "x" * (n % 37)},
                      separators=(",", ":")).encode() + b"\n"


def append_messages(client: Any, journal: str, first: int, count: int, per_append: int = 3) -> None:
    """Messages first..first+count-1, a few per append (whole messages per append)."""
    n = first
    while n < first + count:
        k = min(per_append, first + count - n)
        client.append(journal, b"".join(message(journal, i) for i in range(n, n + k)))
        n += k


def persisted_end(store_url: str, journal: str) -> int:
    from fragment_store import CoverSet, list_fragments, open_store

    end = 0
    for f in CoverSet(list_fragments(open_store(store_url), journal)):
        if f.begin > end:
            break
        end = max(end, f.end)
    return end


def wait_for(condition: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
