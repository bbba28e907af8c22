"""Faulty disks for tests and chaos: a size-limited tmpfs (ENOSPC) and errfs (EIO/EROFS).

Both need root (mount). Every mount gets a unique name under a fresh temporary
directory (prefix `quire-faults-`) and is always unmounted on exit, also when the body
failed; a filesystem still held by a process is detached lazily (`umount -l`), so the
holder keeps working on it and nothing is left in the mount table. Nothing here ever
writes to the real disk beyond empty directories: the tmpfs is RAM bounded by its size,
and errfs passes through to a directory on such a tmpfs.

* `tmpfs(size)` — a tmpfs of `size` bytes; `fill(path, leave)` then takes all but
  `leave` bytes of it with a ballast file (removed to give the room back).
* `errfs(size)` — errfs (tools/services/errfs.py) over a tmpfs of `size` bytes; its
  `fail("eio" | "erofs")` makes every later write fail with that error, `fail_reads(name)`
  every read of one file, `heal()` stops it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from .process import Service, wait_for

__all__ = ["ErrFs", "errfs", "fill", "mounted", "tmpfs", "unmount"]

PREFIX = "quire-faults-"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _unescape(field: str) -> str:
    """A path as /proc/self/mounts writes it (space, tab, newline, backslash in octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounted(path: str | Path) -> bool:
    """Whether `path` is a mount point, from the kernel's mount table. Never a stat of
    the path itself (what os.path.ismount does): on a FUSE mount that stat is a request
    to the filesystem's process, and one that is stopped or stuck never answers it."""
    want = os.path.abspath(path)
    with open("/proc/self/mounts") as f:
        return any(len(fields) > 1 and _unescape(fields[1]) == want
                   for fields in (line.split() for line in f))


def unmount(path: str | Path) -> None:
    """Unmount `path` if mounted (lazily: a process still holding files keeps them)."""
    if mounted(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@contextlib.contextmanager
def tmpfs(size: int, name: str = "spool") -> Iterator[Path]:
    """A fresh tmpfs of `size` bytes, mounted at a unique directory; unmounted after."""
    base = Path(tempfile.mkdtemp(prefix=PREFIX))
    mnt = base / name
    mnt.mkdir()
    try:
        _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755",
             f"{PREFIX}{uuid.uuid4().hex[:8]}", str(mnt))
        yield mnt
    finally:
        unmount(mnt)
        shutil.rmtree(base, ignore_errors=True)


def fill(path: str | Path, leave: int = 0) -> Path:
    """Take all but `leave` free bytes of the filesystem at `path` with one ballast file
    (unlink it to give the room back). Only for the small filesystems made here."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if free > 1 << 30:
        raise ValueError(f"{path} has {free} bytes free: not one of the small test filesystems")
    ballast = Path(path) / f".ballast-{uuid.uuid4().hex[:8]}"
    size = max(0, free - leave)
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = b"\0" * (1 << 20)
        written = 0
        while written < size:
            try:
                written += os.write(fd, chunk[:min(len(chunk), size - written)])
            except OSError:
                break  # full already (metadata takes its share)
    finally:
        os.close(fd)
    return ballast


class ErrFs:
    """A mounted errfs: `path` is where to write; `fail(mode)` / `heal()` switch errors."""

    def __init__(self, path: Path, control: Path, service: Service, backing: Path) -> None:
        self.path = path
        self.control = control
        self.service = service
        self.backing = backing

    def fail(self, mode: str) -> None:
        if mode not in ("eio", "erofs"):
            raise ValueError(f"errfs mode must be eio or erofs, not {mode!r}")
        self._write(mode)

    def fail_reads(self, name: str) -> None:
        """Every read of a file whose path contains `name` fails with EIO (mount it
        with direct_io, or cached pages may answer instead)."""
        if not name or ":" in name:
            raise ValueError(f"errfs read target must be a non-empty name without ':', not {name!r}")
        self._write(f"eio-read:{name}")

    def heal(self) -> None:
        self._write("ok")

    def _write(self, mode: str) -> None:
        tmp = self.control.with_suffix(".new")
        tmp.write_text(mode)
        os.replace(tmp, self.control)  # (a new inode: errfs sees a changed stat)
        time.sleep(0.01)  # mtime granularity: two switches in one tick look alike


@contextlib.contextmanager
def errfs(size: int = 64 << 20, name: str = "spool", direct_io: bool = False) -> Iterator[ErrFs]:
    """errfs over a tmpfs of `size` bytes, at a unique mount point; unmounted after.
    `direct_io`: the kernel caches no content, so every read reaches errfs."""
    with tmpfs(size, "backing") as backing:
        base = backing.parent
        mnt = base / name
        mnt.mkdir()
        control = base / "errfs.control"
        control.write_text("ok")
        service = Service(f"errfs-{uuid.uuid4().hex[:6]}",
                          [sys.executable, "-m", "tools.services.errfs", str(backing), str(mnt),
                           str(control), *(["--direct-io"] if direct_io else [])],
                          probe=lambda: mounted(mnt), ready_timeout=30.0)
        try:
            service.start()
            yield ErrFs(mnt, control, service, backing)
        finally:
            control.write_text("ok")
            unmount(mnt)
            service.stop()
            service.close()
            wait_for(lambda: not mounted(mnt), timeout=10.0, what="errfs unmounted")
