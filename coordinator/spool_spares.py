"""Spare spool files, made when a journal is hosted rather than on its first append.

Making a file costs an inode, and so does a journal's spool directory: on this project's
2-vCPU VMs (ext4) each is ~250–480 µs of CPU, against ~10 µs to rename a file and ~3 µs
to open one that exists (2026-11-29, under load). A journal's first append at each member
made both — the directory and its first spool file — so over 10,000 journals, where
nearly every append of a ten-second round-robin window is a journal's first, each append
cost ~1.5–2 ms of the members' CPU, more than ten plain appends.

So when a coordinator starts hosting a journal (host.py `replica`), one thread of the
DiskFiles makes the journal's directory and an empty spare file in it, `.next`, off the
event loop; the journal's first spool file is that spare, opened and renamed
(DiskFiles.create), and a journal whose spare is not there yet makes its file as before.
The cost: one empty file (an inode, no descriptor) per hosted journal that has not yet
appended; recovery ignores it (it is neither an open `.spool` nor a sealed fragment),
and a journal that leaves keeps it, as it keeps its directory.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path

__all__ = ["SPARE", "Spares"]

SPARE = ".next"
"""The spare's name in a journal's spool directory."""
_EXCL = os.O_RDWR | os.O_CREAT | os.O_EXCL


def make_spare(root: Path, journal: str) -> bool:
    """`journal`'s directory and spare file under `root`, if not there (blocking); True
    if a spare was made."""
    directory = root / journal
    spare = directory / SPARE
    try:
        fd = os.open(spare, _EXCL, 0o644)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        try:
            fd = os.open(spare, _EXCL, 0o644)
        except FileExistsError:
            return False
    os.close(fd)
    return True


def take_spare(directory: Path, path: Path) -> int | None:
    """The spare of `directory`, opened and renamed to `path`: its descriptor, or None
    when there is none (the caller makes the file)."""
    spare = directory / SPARE
    try:
        fd = os.open(spare, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        os.rename(spare, path)
    except OSError:
        os.close(fd)
        return None
    return fd


class Spares:
    """The journals whose spare is yet to be made, and the one thread making them (it
    exits when none is left, and starts again with the next)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pending: deque[str] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.made = 0
        self.failed = 0
        """Spares that could not be made (a full or failing disk: the journal's first
        append then makes its file, and says what is wrong)."""

    def add(self, journal: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending.append(journal)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spool-spares", daemon=True)
                self._thread.start()

    def idle(self) -> bool:
        """Nothing pending and no thread at work."""
        with self._lock:
            return self._thread is None

    def close(self) -> None:
        """No more spares: pending ones are dropped (the thread stops after its current one)."""
        with self._lock:
            self._closed = True
            self._pending.clear()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                journal = self._pending.popleft()
            try:
                self.made += make_spare(self.root, journal)
            except OSError:
                self.failed += 1
