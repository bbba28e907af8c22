"""The checkpoint of a Dask streaming query (spark.dask_stream): a directory the driver
alone writes, laid out as Spark's is.

    <dir>/metadata        {"id": "<query id>"}   made once; the id keys the sink's writes
    <dir>/offsets/<n>     {"start": {journal: offset}, "end": {...}}   written *before*
                          micro-batch n runs (a write-ahead log of what the batch is)
    <dir>/commits/<n>     {"appended": [[journal, begin, end, messages], ...]}   written
                          after batch n's output is appended

A driver that starts on a checkpoint whose last batch has offsets but no commit runs
that batch again over the same offsets; the sink's idempotency key (query id, batch id)
makes its appends land once. Files are written whole (a temporary file, then rename),
so a driver killed mid-write leaves the previous state. A malformed file raises
`CheckpointError` naming it.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import ValidationError

from .offsets import OffsetsError, check_offsets


class CheckpointError(ValidationError):
    """A checkpoint file is missing a field or malformed; the message names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint file {str(path)!r}", reason)
        self.file = path


@dataclass(frozen=True)
class PlannedBatch:
    """Micro-batch `batch_id`: every journal's bytes [start, end)."""

    batch_id: int
    start: dict[str, int]
    end: dict[str, int]


def _write(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(path, f"not JSON ({exc.msg})") from None


class Checkpoint:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        for sub in ("offsets", "commits"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        meta = self.dir / "metadata"
        if not meta.exists():
            _write(meta, {"id": uuid.uuid4().hex})
        value = _read(meta)
        query_id = value.get("id") if isinstance(value, dict) else None
        if not isinstance(query_id, str) or not query_id:
            raise CheckpointError(meta, "no query id (expected {\"id\": \"<hex>\"})")
        self.query_id = query_id

    def _batches(self, sub: str) -> list[int]:
        out = []
        for p in (self.dir / sub).iterdir():
            if p.name.startswith("."):
                continue  # a write a killed driver left unfinished
            if not p.name.isdigit():
                raise CheckpointError(p, "not a micro-batch file (names are batch ids)")
            out.append(int(p.name))
        return sorted(out)

    def last_planned(self) -> PlannedBatch | None:
        """The last micro-batch with offsets, or None for a new query."""
        batches = self._batches("offsets")
        if not batches:
            return None
        path = self.dir / "offsets" / str(batches[-1])
        value = _read(path)
        if not isinstance(value, dict) or not {"start", "end"} <= set(value):
            raise CheckpointError(path, "expected {\"start\": {...}, \"end\": {...}}")
        try:
            return PlannedBatch(batches[-1], check_offsets(value["start"], "start"),
                                check_offsets(value["end"], "end"))
        except OffsetsError as exc:
            raise CheckpointError(path, str(exc)) from None

    def committed(self, batch_id: int) -> bool:
        return (self.dir / "commits" / str(batch_id)).exists()

    def plan(self, batch: PlannedBatch) -> None:
        _write(self.dir / "offsets" / str(batch.batch_id),
               {"start": batch.start, "end": batch.end})

    def commit(self, batch_id: int, appended: list[tuple[str, int, int, int]]) -> None:
        _write(self.dir / "commits" / str(batch_id), {"appended": [list(a) for a in appended]})
