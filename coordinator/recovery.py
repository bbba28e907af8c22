"""Closed fragments left in the spool directory by a previous run of this coordinator.

A closed fragment's file is sealed as `<spool_dir>/<journal>/<begin>-<end>-<sum>.raw`
(spool.DiskFile.seal) and kept until the fragment index shows it persisted. If the
process stops first, the file is still the only local copy and may be the only copy
at all (the persist task may never have run: Redis keeps no tasks across its own
restart, and a task queued just before our crash may be lost). So on start every
sealed file is handed to the persister again (persist tasks are idempotent: a
duplicate costs an Exists check) and kept until the index covers it — by the replica
it belongs to if we host the journal again, else by `RecoveredFragments.persisted`.

What is not recovered, on purpose: `*.spool` files (an open spool at the crash: which
of its bytes were committed, and their SHA-1, is unknown; the journal's other
replicas hold the committed ones, as in Gazette, whose spools are unlinked temp files)
and the recycle pool `.free/`. Both are deleted.

A graceful exit (drain.py) leaves one more thing: `<spool_dir>/<journal>/.head.json`,
the write head (end offset and registers) of a replica whose spool was empty at exit —
every offset below it was written. The next incarnation resumes that replica's spool
there (`Replica.resume_at`) and deletes the file, so a plain append continues at the
head. A crash leaves no (current) head: the spool then starts at 0 as before, and the
index or the recovered fragments refuse appends below their end. A head only ever
moves the spool forward, and a pipeline sync rolls it further to any peer's end.

Graceful or not, a replica also leaves its marks log
(`<spool_dir>/<journal>/.producers.log`, producer_log.py): the producer table's crash
record. `journals_with_marks` finds the logs of existing journals; the replica that
hosts the journal again replays its log (`RecoveredFragments.take_marks`), keeping only
the marks of transactions whose bytes are in sealed fragments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from protocol.logs import get_logger
from protocol import Codec, Fragment, LabelSet, ProducerSnapshot

from .producer_log import LOG_FILE
from .replica import LocalFragment
from .spool import DiskFile, DiskFiles

__all__ = ["Head", "RecoveredFragments", "journals_with_marks", "read_heads", "scan_spool_dir",
           "write_head"]

log = get_logger(__name__)

_SEALED = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})\.raw$")
HEAD_FILE = ".head.json"
"""No journal name segment starts with '.', so this never collides with a journal."""


class Head(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's write head at a graceful exit (its spool was empty there)."""

    end: int
    registers: LabelSet = LabelSet()
    codec: Codec = Codec.NONE
    producers: ProducerSnapshot | None = None
    """The producer table (exactly-once appends) at the head, so deduplication survives
    a restart of every replica (docs/exactly-once.md)."""


def write_head(files: DiskFiles, journal: str, fragment: Fragment, registers: LabelSet,
               producers: ProducerSnapshot | None = None) -> None:
    """Record `fragment.end` (an empty spool's position) for the next incarnation."""
    path = files.root / journal / HEAD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(HEAD_FILE + ".tmp")
    tmp.write_bytes(msgspec.json.encode(Head(end=fragment.end, registers=registers,
                                             codec=fragment.codec, producers=producers)))
    os.replace(tmp, path)  # whole or absent, never torn


def read_heads(files: DiskFiles, journals: Iterable[str]) -> dict[str, Head]:
    """The recorded heads of `journals` (existing journals: others are left alone)."""
    heads: dict[str, Head] = {}
    for journal in journals:
        path = files.root / journal / HEAD_FILE
        try:
            heads[journal] = msgspec.json.decode(path.read_bytes(), type=Head)
        except FileNotFoundError:
            continue
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable write head", path=str(path), error=repr(exc))
    return heads


def journals_with_marks(files: DiskFiles, journals: Iterable[str]) -> set[str]:
    """The existing `journals` for which a previous run left a marks log."""
    return {j for j in journals if (files.root / j / LOG_FILE).is_file()}


def scan_spool_dir(files: DiskFiles, codec_of: Callable[[str], Codec | None]
                   ) -> dict[str, list[LocalFragment]]:
    """journal -> its sealed fragments on disk (in offset order), each with an open file.

    `codec_of(journal)` is the journal's current codec, or None if the journal no longer
    exists (its files are then left alone: nothing could persist them, and an operator
    may still want them). A file whose size does not match its name is left alone too.
    """
    root = files.root
    found: dict[str, list[LocalFragment]] = {}
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root and ".free" in dirnames:
            dirnames.remove(".free")
            _remove_all(root / ".free")
        journal = here.relative_to(root).as_posix()
        for name in filenames:
            path = here / name
            if name.endswith(".spool"):
                log.info("dropping an open spool left by a previous run", path=str(path))
                path.unlink(missing_ok=True)
                continue
            m = _SEALED.match(name)
            if m is None or journal == ".":
                continue
            begin, end, digest = int(m[1], 16), int(m[2], 16), m[3]
            codec = codec_of(journal)
            if codec is None or end <= begin or path.stat().st_size != end - begin:
                log.warning("leaving an unrecognised fragment file alone", path=str(path),
                            journal_exists=codec is not None)
                continue
            frag = Fragment(journal=journal, begin=begin, end=end, sum=digest, codec=codec)
            fd = os.open(path, os.O_RDWR)
            found.setdefault(journal, []).append(LocalFragment(frag, DiskFile(path, None, fd)))
    for frags in found.values():
        frags.sort(key=lambda lf: (lf.fragment.begin, lf.fragment.end))
    return found


def _remove_all(d: Path) -> None:
    for p in d.iterdir():
        p.unlink(missing_ok=True)


class RecoveredFragments:
    """Recovered fragments (and heads) of journals we do not (yet) host again."""

    def __init__(self, by_journal: dict[str, list[LocalFragment]],
                 heads: dict[str, Head] | None = None, files: DiskFiles | None = None,
                 marks: set[str] | None = None) -> None:
        self.by_journal = by_journal
        self.heads = heads or {}
        self._files = files
        self.marks = marks or set()

    def take_marks(self, journal: str) -> bytes | None:
        """A journal's marks log from a previous run, once (None: none, or taken)."""
        if journal not in self.marks or self._files is None:
            return None
        self.marks.discard(journal)
        try:
            return (self._files.root / journal / LOG_FILE).read_bytes()
        except OSError as exc:
            log.warning("ignoring an unreadable marks log", journal=journal, error=repr(exc))
            return None

    def take_head(self, journal: str) -> Head | None:
        """A journal's recorded head, once: the file goes as its replica adopts it."""
        head = self.heads.pop(journal, None)
        if head is not None and self._files is not None:
            (self._files.root / journal / HEAD_FILE).unlink(missing_ok=True)
        return head

    def journals(self) -> Iterable[str]:
        return list(self.by_journal)

    def take(self, journal: str) -> list[LocalFragment]:
        """Hand a journal's fragments to its (new) replica, which drops them once persisted."""
        return self.by_journal.pop(journal, [])

    def persisted(self, journal: str, remote: Iterable[Fragment]) -> None:
        """Delete the files the index shows persisted (whole span covered)."""
        frags = self.by_journal.get(journal)
        if not frags:
            return
        spans = [(f.begin, f.end) for f in remote if f.end > f.begin]
        kept = []
        for lf in frags:
            if any(b <= lf.fragment.begin and lf.fragment.end <= e for b, e in spans):
                assert lf.file is not None
                lf.file.discard()
                log.info("recovered fragment persisted; deleted", journal=journal,
                         begin=lf.fragment.begin, end=lf.fragment.end)
            else:
                kept.append(lf)
        if kept:
            self.by_journal[journal] = kept
        else:
            del self.by_journal[journal]

    @property
    def bytes(self) -> int:
        return sum(lf.fragment.end - lf.fragment.begin for frags in self.by_journal.values()
                   for lf in frags)
