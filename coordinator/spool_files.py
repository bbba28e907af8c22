"""Spool files: where a Spool keeps one fragment's raw content.

The `SpoolFile` / `FileFactory` interface a Spool (spool.py) writes through, and its
two implementations: `MemoryFile(s)` (tests, tiny journals) and `DiskFile(s)` (pread/
pwrite under the spool directory, with a small pool of recycled files). Split from
spool.py along the seam the spool's docstring draws: the Spool is sans-IO, these are
the IO it is given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from protocol import Fragment

__all__ = ["DiskFile", "DiskFiles", "FileFactory", "MemoryFile", "MemoryFiles", "SpoolFile"]


class SpoolFile(Protocol):
    """Random-access byte storage of one fragment's raw content."""

    path: str | None

    def write_at(self, offset: int, data: bytes | memoryview) -> None: ...
    def read_at(self, offset: int, size: int) -> bytes: ...
    def truncate(self, size: int) -> None: ...
    def seal(self, fragment: Fragment) -> None:
        """The fragment is closed: no more writes; keep the bytes (maybe under a new name)."""
    def discard(self) -> None:
        """Release the bytes for good (after persistence, or when dropped)."""


class FileFactory(Protocol):
    def create(self, journal: str, begin: int) -> SpoolFile: ...


class MemoryFile:
    """A bytearray: tests and the property test use it; so can tiny journals."""

    path: str | None = None

    def __init__(self) -> None:
        self.buf = bytearray()

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        if offset > len(self.buf):
            self.buf.extend(b"\0" * (offset - len(self.buf)))
        self.buf[offset:offset + len(data)] = data

    def read_at(self, offset: int, size: int) -> bytes:
        return bytes(self.buf[offset:offset + size])

    def truncate(self, size: int) -> None:
        del self.buf[size:]

    def seal(self, fragment: Fragment) -> None:
        pass

    def discard(self) -> None:
        self.buf = bytearray()


class MemoryFiles:
    def create(self, journal: str, begin: int) -> SpoolFile:
        return MemoryFile()


class DiskFile:
    """A file under the spool directory, read and written with pread/pwrite.

    The fd stays open until discard(): readers of a closed fragment keep working even
    while it is renamed, and a discard between two reads surfaces as FileNotFoundError
    for the *next* lookup, never as torn content.
    """

    def __init__(self, path: Path, files: DiskFiles | None = None, fd: int = -1) -> None:
        self.path: str | None = str(path)
        self._files = files
        self._fd = fd if fd >= 0 else os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def read_at(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def truncate(self, size: int) -> None:
        # Only a rollback truncates, and only the uncommitted tail; a recycled file may
        # hold stale bytes further out, which no reader can see (reads stop at the
        # committed end) and seal() cuts off.
        os.ftruncate(self._fd, size)

    def seal(self, fragment: Fragment) -> None:
        # Name the closed file after its content so a restart (or an operator) can tell
        # what it holds; the open fd is unaffected by the rename.
        assert self.path is not None
        if self._files is not None and self._files.before_seal is not None:
            self._files.before_seal(fragment)
        sealed = Path(self.path).with_name(f"{fragment.begin:016x}-{fragment.end:016x}-{fragment.sum}.raw")
        os.ftruncate(self._fd, fragment.end - fragment.begin)
        os.rename(self.path, sealed)
        self.path = str(sealed)

    def discard(self) -> None:
        if self._fd < 0:
            return
        fd, path, self._fd, self.path = self._fd, self.path, -1, None
        if self._files is not None and path and self._files.recycle(fd, path):
            return
        os.close(fd)
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


class DiskFiles:
    """Spool files at `<root>/<journal>/<begin:016x>.spool` (journal names are clean paths).

    Discarded files (closed fragments already persisted) are kept in a small free pool
    and overwritten by the next spool instead of unlinked: writing into pages the page
    cache already holds costs a memcpy, while fresh pages cost an allocation each —
    the difference is ~40% of spool throughput (see docs/benchmarks.md).
    """

    def __init__(self, root: str | Path, recycle: int = 4) -> None:
        self.root = Path(root)
        self.before_seal: Callable[[Fragment], None] | None = None
        """Called as a file is sealed, before its rename: what describes the fragment's
        content must be on disk before a restart can recover it (producer_log.py)."""
        self._limit = recycle
        self._free: list[tuple[int, Path]] = []
        self._seq = 0

    def create(self, journal: str, begin: int) -> SpoolFile:
        path = self.root / journal / f"{begin:016x}.spool"
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._free:
            fd, old = self._free.pop()
            os.rename(old, path)
            return DiskFile(path, self, fd)
        return DiskFile(path, self)

    def recycle(self, fd: int, path: str) -> bool:
        if len(self._free) >= self._limit:
            return False
        self._seq += 1
        free = self.root / ".free" / f"{os.getpid()}-{self._seq}"
        try:
            free.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, free)
        except OSError:
            return False
        self._free.append((fd, free))
        return True

    def close(self) -> None:
        while self._free:
            fd, path = self._free.pop()
            os.close(fd)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
