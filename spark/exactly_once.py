"""The sinks' exactly-once identifiers (docs/spark.md "Exactly-once", docs/exactly-once.md).

A sink task is a producer (DESIGN.md §15, "Sinks are producers"): every append it makes
carries a `TxnId` derived only from what the engine keeps across retries, so a retried,
speculative or re-run attempt re-sends the same identifiers and the broker answers the
first attempt's commit instead of writing again.

    level       Spark batch              Spark streaming               Dask to_quire
    producer    sink/<write id>          sink/<query id>               sink/<write id>
    generation  1                        1                             1
    history     partition + 1            (batch + 1) << 24 | part + 1  partition + 1
    txn         the task's nth append to that journal (1: one append per journal per task)

The write id is made once on the driver (Spark: when the writer is created, which Spark
then pickles to every attempt of every task; Dask: when `to_quire` builds the graph, and
it names the graph's task keys). The query id is the streaming query's, which its
checkpoint keeps across restarts. An `idempotency_key` replaces the write or query id,
so writes with the same key and the same partitioning land once even from different
applications. Nothing here is random in a task, and no attempt number is used.

The generation never changes: a sink's producer is one write (or query, or key), not a
long-lived process, so there is no older incarnation to retire.

`fault_after_append` is the sinks' fault hook for tests (QUIRE_SINK_FAULT): it is inert
unless that variable is set.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

GENERATION = 1
STREAM_SHIFT = 24
"""A streaming history keeps the partition in its low 24 bits, the batch above them."""
MAX_PARTITION = (1 << STREAM_SHIFT) - 2
MAX_BATCH = (1 << (64 - STREAM_SHIFT)) - 2
PREFIX = "sink/"
_TOKEN = re.compile(r"[A-Za-z0-9\-_+/.]{1,100}")
FAULT_ENV = "QUIRE_SINK_FAULT"


class SinkIdentityError(ValueError):
    """A sink task cannot be given exactly-once identifiers (the message says why)."""


def new_write_id() -> str:
    """A write's id, made once on the driver (never in a task)."""
    return uuid.uuid4().hex


def producer_for(base: str) -> str:
    """The producer token of a write id, query id or idempotency key.

    A base that is a short token is used as it is (readable in the broker's table);
    anything else by its SHA-1, so every key maps to a valid producer name."""
    if not base:
        raise SinkIdentityError("an empty write id, query id or idempotency key")
    if _TOKEN.fullmatch(base) and not base.startswith("sha1."):
        return PREFIX + base
    return PREFIX + "sha1." + hashlib.sha1(base.encode()).hexdigest()


def _check_partition(partition: int) -> None:
    if not 0 <= partition <= MAX_PARTITION:
        raise SinkIdentityError(f"partition {partition} is out of range for exactly-once "
                                f"identifiers (0..{MAX_PARTITION})")


@dataclass(frozen=True)
class TaskIds:
    """One task's producer and history; `txn(n)` is its nth append to a journal."""

    producer: str
    history: int

    @classmethod
    def batch(cls, base: str, partition: int) -> TaskIds:
        """A batch write's task (Spark `df.write`, Dask `to_quire`)."""
        _check_partition(partition)
        return cls(producer_for(base), partition + 1)

    @classmethod
    def stream(cls, base: str, batch_id: int, partition: int) -> TaskIds:
        """A streaming micro-batch's task: histories never equal a batch write's."""
        _check_partition(partition)
        if not 0 <= batch_id <= MAX_BATCH:
            raise SinkIdentityError(f"batch id {batch_id} is out of range (0..{MAX_BATCH})")
        return cls(producer_for(base), ((batch_id + 1) << STREAM_SHIFT) | (partition + 1))

    def txn(self, position: int = 1) -> object:
        from quire.client import TxnId

        return TxnId(self.producer, GENERATION, self.history, position)


def task_label(task: str) -> str:
    """A file-name-safe name of a task (write/query id, batch, partition)."""
    return hashlib.sha1(task.encode()).hexdigest()[:16]


def fault_after_append(task: str, attempt: str = "") -> None:
    """Test fault hook, called by a task right after all its appends committed; `task`
    names the task the same way in every attempt (write or query id, partition).

    QUIRE_SINK_FAULT=exit-after-append:<dir>   the task's process exits (os._exit(86))
        the first time an attempt of `task` gets here (a marker file in <dir> says it
        did), before it can report success: the task's retry must land once.
    QUIRE_SINK_FAULT=hang-after-append:<dir>   the first attempt of the first task to
        get here (only that one) sleeps, up to 10 minutes, so a speculative copy of it
        finishes the task first.

    Every arrival also leaves `<dir>/<task label>.attempt-<attempt>` so a test can see
    which attempts ran. Without QUIRE_SINK_FAULT this does nothing.
    """
    spec = os.environ.get(FAULT_ENV, "")
    if not spec or not task:
        return
    kind, _, where = spec.partition(":")
    if kind not in ("exit-after-append", "hang-after-append"):
        return
    root = Path(where)
    root.mkdir(parents=True, exist_ok=True)
    label = task_label(task)
    (root / f"{label}.attempt-{attempt or os.getpid()}").touch()
    try:
        fd = os.open(root / ("hung" if kind == "hang-after-append" else f"{label}.first"),
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # a later attempt (or, hanging, a later task): it completes
    os.write(fd, label.encode())
    os.close(fd)
    if kind == "exit-after-append":
        os._exit(86)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.5)


def fault_stream_commit(batch_id: int) -> None:
    """QUIRE_SINK_FAULT=hang-at-commit:<dir>:<batch>: the streaming sink's driver-side
    commit of micro-batch <batch> (its tasks' appends are committed; Spark has not yet
    written the batch to its commit log) leaves `<dir>/batch-<batch>.committed` and
    hangs there, so a test can kill the driver at exactly that point."""
    spec = os.environ.get(FAULT_ENV, "")
    kind, _, rest = spec.partition(":")
    if kind != "hang-at-commit":
        return
    where, _, batch = rest.rpartition(":")
    if not batch.isdigit() or int(batch) != batch_id:
        return
    marker = Path(where) / f"batch-{batch_id}.committed"
    if marker.exists():
        return  # the restarted driver re-runs the batch: let it through
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.5)
