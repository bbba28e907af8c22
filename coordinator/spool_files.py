"""Spool files: where a Spool keeps one fragment's raw content.

The `SpoolFile` / `FileFactory` interface a Spool (spool.py) writes through, and its
two implementations: `MemoryFile(s)` (tests, tiny journals) and `DiskFile(s)` (pread/
pwrite under the spool directory, with a small pool of recycled files). Split from
spool.py along the seam the spool's docstring draws: the Spool is sans-IO, these are
the IO it is given.

A DiskFile writes behind: inside an event loop, the contiguous writes of one loop turn
(every append the turn served) go down in one `pwritev` at the end of the turn, not
one `pwrite` each. A read, truncate, seal or discard writes what is held first, and
`flush()` is the acknowledgement barrier: a replica flushes before its answers leave
(replicate_api.py), the primary before it resolves a commit's ticket (pipeline.py), so
nothing is acknowledged that has not reached the page cache. A write that fails is
kept and raised by the next write, read, flush or seal.

A big write (`OVERLAP` and up: a large append's chunk) goes to a writer thread instead,
so that its copy into the page cache overlaps the SHA-1 the spool folds the same bytes
into (both release the GIL); the same barriers wait for it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from protocol import Fragment

from .spool_spares import Spares, take_spare

if TYPE_CHECKING:  # an annotation only (the Host sets it; spool_health imports nothing of ours)
    from .spool_health import SpoolHealth

__all__ = ["DiskFile", "DiskFiles", "FileFactory", "MemoryFile", "MemoryFiles", "SpoolFile"]

WRITE_BEHIND = 1 << 20
"""At most this many bytes are held for the end of the loop turn (a write that would go
past it writes what is held first)."""
_IOV_MAX = 1024
"""Buffers per pwritev (Linux's IOV_MAX)."""
_CREATE = os.O_RDWR | os.O_CREAT | os.O_TRUNC
OVERLAP = 256 << 10
"""Writes of at least this many bytes go to the writer thread (module docstring)."""

_writer: ThreadPoolExecutor | None = None
_writer_lock = threading.Lock()


def _owned(data: bytes | memoryview) -> bytes:
    """`data` as bytes that cannot change while a write holds them (bytes are
    immutable; anything else is copied)."""
    return data if type(data) is bytes else bytes(data)


def _writer_thread() -> ThreadPoolExecutor:
    """The process's one spool writer thread (started at the first big write)."""
    global _writer
    if _writer is None:
        with _writer_lock:
            if _writer is None:
                _writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool-writer")
    return _writer


class SpoolFile(Protocol):
    """Random-access byte storage of one fragment's raw content."""

    path: str | None

    def write_at(self, offset: int, data: bytes | memoryview) -> None: ...
    def read_at(self, offset: int, size: int) -> bytes: ...
    def flush(self) -> None:
        """Every write so far has reached the file (raises if one failed)."""
    def truncate(self, size: int) -> None: ...
    def seal(self, fragment: Fragment) -> None:
        """The fragment is closed: no more writes; keep the bytes (maybe under a new name)."""
    def discard(self, recycle: bool = True) -> None:
        """Release the bytes for good (after persistence, or when dropped); `recycle`
        False: never reuse the file (a copy that could not be read back)."""


class FileFactory(Protocol):
    def create(self, journal: str, begin: int) -> SpoolFile: ...
    def prepare(self, journal: str) -> None:
        """The journal is hosted here now: make ready, off the event loop, what its
        first spool file needs (spool_spares.py)."""


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

    def flush(self) -> None:
        pass

    def truncate(self, size: int) -> None:
        del self.buf[size:]

    def seal(self, fragment: Fragment) -> None:
        pass

    def discard(self, recycle: bool = True) -> None:
        self.buf = bytearray()


class MemoryFiles:
    def create(self, journal: str, begin: int) -> SpoolFile:
        return MemoryFile()

    def prepare(self, journal: str) -> None:
        pass


class DiskFile:
    """A file under the spool directory, read and written with pread/pwrite.

    The fd stays open until discard(): readers of a closed fragment keep working even
    while it is renamed, and a discard between two reads surfaces as FileNotFoundError
    for the *next* lookup, never as torn content.
    """

    def __init__(self, path: Path, files: DiskFiles | None = None, fd: int = -1) -> None:
        self.path: str | None = str(path)
        self._files = files
        self._fd = fd if fd >= 0 else os.open(path, _CREATE, 0o644)
        self._held: list[bytes] = []
        """Writes held for the end of the loop turn: contiguous, from `_at` to `_end`."""
        self._at = self._end = 0
        self._failed: OSError | None = None
        self._failed_at = 0
        """Where the failed write began: a truncate to there or below cuts it off."""
        self._writing: tuple[int, Future[None]] | None = None
        """(offset, its future) of the big write the writer thread has in hand."""

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        if self._writing is not None:
            self._join()
        if len(data) >= OVERLAP:
            self.flush()  # (what is held goes first, and a failure is raised here)
            self._writing = (offset, _writer_thread().submit(self._write, offset, _owned(data)))
            return
        held = self._held
        if held:
            if offset == self._end and len(held) < _IOV_MAX \
                    and offset + len(data) - self._at <= WRITE_BEHIND:
                held.append(_owned(data))
                self._end += len(data)
                return
            self.flush()
        elif self._failed is not None:
            self._raise_failed()
        loop = asyncio._get_running_loop()
        if loop is None:
            self._write(offset, data)  # outside a loop (tools, tests): now
            return
        self._held = [_owned(data)]
        self._at, self._end = offset, offset + len(data)
        loop.call_soon(self._flush_at_turn_end)

    def _join(self) -> None:
        """Wait for the writer thread's write; a failure becomes this file's."""
        writing, self._writing = self._writing, None
        assert writing is not None
        try:
            writing[1].result()
        except OSError as exc:
            self._fail(writing[0], exc)
            raise

    def _fail(self, at: int, exc: OSError) -> None:
        if self._failed is None or at < self._failed_at:
            self._failed_at = at
        self._failed = exc

    def flush(self) -> None:
        if self._writing is not None:
            self._join()
        held = self._held
        if not held:
            if self._failed is not None:
                self._raise_failed()
            return
        self._held = []
        try:
            if len(held) == 1:
                self._write(self._at, held[0])
            else:
                n = os.pwritev(self._fd, held, self._at)
                if n < self._end - self._at:
                    self._write(self._at + n, b"".join(held)[n:])
        except OSError as exc:
            self._fail(self._at, exc)
            raise

    def _flush_at_turn_end(self) -> None:
        try:
            self.flush()
        except OSError:
            pass  # kept in _failed: the next write, read, flush or seal raises it

    def _raise_failed(self) -> None:
        exc = self._failed
        assert exc is not None
        raise OSError(exc.errno, f"an earlier write to {self.path} failed: {exc.strerror or exc}")

    def _write(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def read_at(self, offset: int, size: int) -> bytes:
        self.flush()
        return os.pread(self._fd, size, offset)

    def truncate(self, size: int) -> None:
        # Only a rollback truncates, and only the uncommitted tail; a recycled file may
        # hold stale bytes further out, which no reader can see (reads stop at the
        # committed end) and seal() cuts off.
        if self._writing is not None:
            self._join()
        if self._held:
            if size <= self._at:
                self._held = []  # all cut off: nothing to write
            else:
                self.flush()
        os.ftruncate(self._fd, size)
        if self._failed is not None and size <= self._failed_at:
            self._failed = None  # what failed to be written is cut off: whole again

    def seal(self, fragment: Fragment) -> None:
        # Name the closed file after its content so a restart (or an operator) can tell
        # what it holds; the open fd is unaffected by the rename.
        assert self.path is not None
        self.flush()
        if self._files is not None and self._files.before_seal is not None:
            self._files.before_seal(fragment)
        sealed = Path(self.path).with_name(f"{fragment.begin:016x}-{fragment.end:016x}-{fragment.sum}.raw")
        os.ftruncate(self._fd, fragment.end - fragment.begin)
        os.rename(self.path, sealed)
        self.path = str(sealed)

    def discard(self, recycle: bool = True) -> None:
        if self._fd < 0:
            return
        self._held = []  # released for good: nothing will read them
        if self._writing is not None:
            try:  # the fd must not be closed or reused under the writer thread
                self._join()
            except OSError:
                pass
        fd, path, self._fd, self.path = self._fd, self.path, -1, None
        if recycle and self._files is not None and path and self._files.recycle(fd, path):
            return
        try:
            os.close(fd)
            if path:
                os.unlink(path)
        except OSError:
            pass  # gone already, or a failing disk (spool_health.py): released all the same


class DiskFiles:
    """Spool files at `<root>/<journal>/<begin:016x>.spool` (journal names are clean paths).

    Discarded files (closed fragments already persisted) are kept in a small free pool
    and overwritten by the next spool instead of unlinked: writing into pages the page
    cache already holds costs a memcpy, while fresh pages cost an allocation each —
    the difference is ~40% of spool throughput (see docs/benchmarks.md).
    """

    def __init__(self, root: str | Path, recycle: int = 4) -> None:
        self.root = Path(root)
        self.health: SpoolHealth | None = None
        """The process's spool_health.SpoolHealth (set by the Host): while it is not ok,
        discarded files are unlinked, not pooled, so their room returns to the disk."""
        self.before_seal: Callable[[Fragment], None] | None = None
        """Called as a file is sealed, before its rename: what describes the fragment's
        content must be on disk before a restart can recover it (producer_log.py)."""
        self._limit = recycle
        self._free: list[tuple[int, Path]] = []
        self._seq = 0
        self.spares = Spares(self.root)

    def prepare(self, journal: str) -> None:
        """Queue the making of the journal's directory and spare file (spool_spares.py)."""
        self.spares.add(journal)

    def create(self, journal: str, begin: int) -> SpoolFile:
        """A new spool file: the journal's spare if there is one (spool_spares.py), else
        a pooled file, else a new one. The journal's directory is made only when the file
        cannot be made without it: a journal's later fragments cost no mkdir and stat."""
        path = self.root / journal / f"{begin:016x}.spool"
        fd = take_spare(path.parent, path)  # (made when the journal came here)
        if fd is not None:
            return DiskFile(path, self, fd)
        if self._free:
            fd, old = self._free.pop()
            try:
                os.rename(old, path)
            except FileNotFoundError:
                os.makedirs(path.parent, exist_ok=True)
                os.rename(old, path)
            return DiskFile(path, self, fd)
        try:
            fd = os.open(path, _CREATE, 0o644)
        except FileNotFoundError:
            os.makedirs(path.parent, exist_ok=True)
            fd = os.open(path, _CREATE, 0o644)
        return DiskFile(path, self, fd)

    def recycle(self, fd: int, path: str) -> bool:
        if len(self._free) >= self._limit or (self.health is not None and not self.health.ok):
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
        self.spares.close()
        while self._free:
            fd, path = self._free.pop()
            os.close(fd)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
