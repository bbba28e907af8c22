"""AppendService's disk queue: whole batches, one file each, a directory per journal.

    <spill_dir>/<quoted journal>/<seq:020d>.batch     raw content of one batch
    <spill_dir>/failed/<quoted journal>/<seq>.batch   batches the cluster refused for good

A batch file is written to a temporary name, fsynced and renamed, so a crash leaves
either the whole batch or nothing — never a torn message that would later be appended
as garbage. Sequence numbers are global and increasing, so sorting a journal's files
restores its append order, also across restarts of the writing process.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

_NAME = re.compile(r"(\d{20})\.batch")


class SpillDir:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _dirname(journal: str) -> str:
        # Journal names contain '/'; quoting keeps one flat directory per journal.
        return urllib.parse.quote(journal, safe="")

    def path_for(self, journal: str, seq: int) -> Path:
        return self.root / self._dirname(journal) / f"{seq:020d}.batch"

    def write(self, journal: str, seq: int, data: bytes | bytearray | memoryview) -> Path:
        path = self.path_for(journal, seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def scan(self) -> list[tuple[str, int, Path, int]]:
        """Every spilled batch as (journal, seq, path, size), in seq order."""
        out: list[tuple[str, int, Path, int]] = []
        for sub in self.root.iterdir():
            if not sub.is_dir() or sub.name == "failed":
                continue
            journal = urllib.parse.unquote(sub.name)
            for item in sub.iterdir():
                if item.suffix == ".tmp":
                    item.unlink(missing_ok=True)  # a write that never completed
                    continue
                m = _NAME.fullmatch(item.name)
                if m:
                    out.append((journal, int(m[1]), item, item.stat().st_size))
        out.sort(key=lambda t: t[1])
        return out

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # only succeeds once the journal's queue is empty
        except OSError:
            pass

    def quarantine(self, journal: str, path: Path) -> Path:
        """Keep a refused batch for an operator instead of deleting data."""
        target = self.root / "failed" / self._dirname(journal) / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        return target
