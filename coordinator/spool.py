"""The Spool: a replica's transactional memory of one journal (sans-IO).

A Spool holds the committed Fragment being built, an uncommitted `delta` of content
beyond it, a running SHA-1 (with the hasher state saved at the last commit), the
journal registers and the time of the fragment's first commit. It is driven only by
replicate messages and validates every transition itself, so each replica checks the
primary independently:

* content (ReplicateContent + bytes): must arrive at `content_delta == delta`; it is
  written to the spool file at `length + delta` and folded into the running SHA-1.
* proposal (ReplicateProposal), evaluated in order:
  - refuse: a proposal ahead of us that says its content is of an older epoch than
    ours (a stale primary's sync): PROPOSAL_MISMATCH, so the primary sees our epoch.
  - roll: `proposal.end > end + delta`, or an empty proposal at `end`: the non-empty
    fragment is closed (handed to the observer) and the spool restarts empty at
    `proposal.end` with the proposal's codec. Uncommitted bytes are dropped.
  - rollback: the proposal equals the committed fragment (and registers): delta is
    discarded, the SHA-1 state restored, the file truncated.
  - commit: `delta != 0` and proposal == `next()`: adopt it, take registers, notify.
  - stale tail: a synchronizing proposal (roll or sync) from a newer `epoch` than this
    spool's last commit, whose epoch history has the first epoch after ours begin
    below this spool's end: the content past that offset is a tail no later route
    acknowledged (its primary failed mid-commit and the journal moved on without this
    replica, acknowledging other bytes at those offsets). It is cut off first — the
    committed content truncated to that offset, or the open fragment discarded (never
    closed: not served, not persisted) when it lies before it — and the roll then
    applies.
  - anything else: PROPOSAL_MISMATCH, answered with this spool's fragment/registers
    (and producer table, epoch and epoch_begin).

The **epoch** is the etcd revision of the route under which the spool's last commit
was adopted (given by the driver: the replicate stream's or the pipeline's header),
and **epoch_begin** the offset where content of that epoch begins here; **epochs** is
the history of such pairs (one per revision that committed here, or adopted with a
roll forward). A sync compares epochs before offsets (append_rules.decide_sync): the
largest offset wins only among tails of the newest epoch, and every older tail of
epoch e is cut where the newest tail's history has the first epoch after e begin —
not merely at the newest epoch's begin: content of epochs in between was acknowledged
too (test_sync_model found the difference) —
on replicas and on the primary alike — so a member that rejoins with an old,
unacknowledged commit can neither outrun nor shadow content acknowledged at the same
offsets since (Kafka's leader-epoch truncation, KIP-101 and KIP-279).

The producer table (producers.py) travels like the registers: a proposal's `mark` is
recorded once the proposal is adopted (a commit, or a barrier that closes a history),
and a roll forward adopts the proposal's whole `producers` snapshot when it has one.

No asyncio, sockets, etcd or store imports: files are reached through the small
`SpoolFile` / `FileFactory` interface (disk and memory implementations in
spool_files.py), and time through an injected clock.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Protocol

from protocol import (EMPTY_SUM, Codec, Fragment, LabelSet, ProducerMark, ProducerSnapshot,
                      ReplicateProposal, ReplicateResponse, Status)
from protocol.errors import QuireError

from .producers import ProducerTable

# The file interface and its implementations live in spool_files.py; re-exported here.
from .spool_files import DiskFile, DiskFiles, FileFactory, MemoryFile, MemoryFiles, SpoolFile  # noqa: F401


class SpoolError(QuireError):
    """A replicate message that no valid primary could have sent; aborts the stream."""


class ContentDeltaMismatch(SpoolError):
    pass


# -- observers --------------------------------------------------------------------------

class SpoolObserver(Protocol):
    def on_commit(self, spool: Spool, fragment: Fragment, primary: bool) -> None: ...
    def on_closed(self, spool: Spool, fragment: Fragment, file: SpoolFile | None,
                  primary: bool) -> None: ...


class NullObserver:
    def on_commit(self, spool: Spool, fragment: Fragment, primary: bool) -> None:
        pass

    def on_closed(self, spool: Spool, fragment: Fragment, file: SpoolFile | None,
                  primary: bool) -> None:
        if file is not None:
            file.discard()


# -- the spool --------------------------------------------------------------------------

_EMPTY_SHA1 = hashlib.sha1()
OK = ReplicateResponse(status=Status.OK)
"""The answer to an adopted proposal (one shared instance: callers test `is OK`)."""
MAX_EPOCHS = 64
"""Epoch history kept (one entry per route revision that committed here). A tail older
than its oldest entry is cut at that entry's begin: more than needed, never less."""
"""Shared and immutable: the answer to every adopted proposal."""


class Spool:
    __slots__ = ("journal", "fragment", "registers", "first_append_time", "delta",
                 "_hasher", "_saved", "_file", "_files", "_observer", "_clock", "producers",
                 "epoch", "epoch_begin", "epochs", "_next")

    def __init__(self, journal: str, *, files: FileFactory | None = None,
                 observer: SpoolObserver | None = None, begin: int = 0,
                 codec: Codec = Codec.NONE, registers: LabelSet = LabelSet(),
                 clock: Callable[[], float] = time.time,
                 producers: ProducerTable | None = None) -> None:
        self.journal = journal
        self.producers = producers if producers is not None else ProducerTable(journal)
        """Identified transactions acted on (exactly-once appends, producers.py)."""
        self.fragment = Fragment(journal=journal, begin=begin, end=begin, codec=codec)
        self.epoch = 0
        """Route revision of the last commit (or of the state a roll adopted); 0 unknown."""
        self.epoch_begin = begin
        """The offset where this spool's content of `epoch` begins."""
        self.epochs: tuple[tuple[int, int], ...] = ()
        """The epoch history: (epoch, begin) of each epoch of our content, oldest first,
        ending with (epoch, epoch_begin) (empty while the epoch is unknown)."""
        self.registers = registers
        self.first_append_time = 0.0
        self.delta = 0
        # hashlib objects are copied, never shared: _saved is the state at the last
        # commit, _hasher the running state through end + delta.
        self._hasher = _EMPTY_SHA1.copy()
        self._saved = _EMPTY_SHA1.copy()
        self._next: tuple[Fragment, int, Fragment] | None = None
        """(fragment, delta, next()) of the last next(): a commit's proposal and its
        check against the spool compute the running SHA-1's digest once, not twice."""
        self._file: SpoolFile | None = None
        self._files: FileFactory = files or MemoryFiles()
        self._observer: SpoolObserver = observer or NullObserver()
        self._clock = clock

    # -- views ----------------------------------------------------------------------

    @property
    def begin(self) -> int:
        return self.fragment.begin

    @property
    def end(self) -> int:
        return self.fragment.end

    @property
    def content_length(self) -> int:
        return self.fragment.end - self.fragment.begin

    @property
    def file(self) -> SpoolFile | None:
        return self._file

    def next(self) -> Fragment:
        """The fragment a commit of the current delta must propose."""
        delta, frag = self.delta, self.fragment
        if delta == 0:
            return frag
        cached = self._next
        if cached is not None and cached[0] is frag and cached[1] == delta:
            return cached[2]
        out = Fragment(journal=self.journal, begin=frag.begin, end=frag.end + delta,
                       sum=self._hasher.hexdigest(), codec=frag.codec)
        self._next = (frag, delta, out)
        return out

    def flush(self) -> None:
        """Every byte applied so far has reached the spool file (the acknowledgement
        barrier of spool_files.DiskFile's write-behind); raises the OSError of a write
        that failed."""
        if self._file is not None:
            self._file.flush()

    def read_committed(self, offset: int, size: int) -> bytes:
        """Committed bytes from journal `offset` (never the uncommitted delta)."""
        if not (self.fragment.begin <= offset <= self.fragment.end):
            raise SpoolError(f"offset {offset} outside the spool {self.fragment.begin}-{self.fragment.end}")
        size = min(size, self.fragment.end - offset)
        if size <= 0 or self._file is None:
            return b""
        return self._file.read_at(offset - self.fragment.begin, size)

    # -- proposals a primary builds (pure) -------------------------------------------

    def commit_proposal(self, registers: LabelSet | None = None,
                        mark: ProducerMark | None = None) -> ReplicateProposal:
        return ReplicateProposal(proposal=self.next(),
                                 registers=self.registers if registers is None else registers,
                                 mark=mark)

    def rollback_proposal(self, acknowledge: bool = False, mark: ProducerMark | None = None,
                          producers: ProducerSnapshot | None = None,
                          epoch: bool = False) -> ReplicateProposal:
        """`epoch`: say which epoch our content is of (a sync proposal does)."""
        return ReplicateProposal(proposal=self.fragment, registers=self.registers,
                                 acknowledge=acknowledge, mark=mark, producers=producers,
                                 epoch=self.epoch if epoch else 0,
                                 epoch_begin=self.epoch_begin if epoch else 0,
                                 epochs=self.epochs if epoch else ())

    def roll_proposal(self, offset: int | None = None, codec: Codec | None = None,
                      registers: LabelSet | None = None, acknowledge: bool = True,
                      producers: ProducerSnapshot | None = None,
                      epoch: int = 0, epoch_begin: int = 0,
                      epochs: tuple[tuple[int, int], ...] = ()) -> ReplicateProposal:
        at = self.fragment.end if offset is None else offset
        return ReplicateProposal(
            proposal=Fragment(journal=self.journal, begin=at, end=at,
                              codec=self.fragment.codec if codec is None else codec),
            registers=self.registers if registers is None else registers, acknowledge=acknowledge,
            producers=producers, epoch=epoch, epoch_begin=epoch_begin, epochs=epochs)

    def should_roll(self, length_target: int, codec: Codec, flush_interval: float,
                    now: float | None = None) -> bool:
        """Roll triggers checked by the primary at the start of an append.

        A codec change takes effect only on an empty spool (never cutting a fragment
        short for it); an empty spool is otherwise never rolled.
        """
        if self.content_length == 0:
            return codec != self.fragment.codec
        if self.content_length >= length_target:
            return True
        if flush_interval > 0 and self.first_append_time:
            now = self._clock() if now is None else now
            return int(self.first_append_time // flush_interval) != int(now // flush_interval)
        return False

    # -- transitions ----------------------------------------------------------------

    def apply(self, message: ReplicateProposal | object, payload: bytes | memoryview = b"",
              *, primary: bool = False, epoch: int = 0) -> ReplicateResponse | None:
        if isinstance(message, ReplicateProposal):
            return self.apply_proposal(message, primary=primary, epoch=epoch)
        self.apply_content(getattr(message, "content_delta"), payload)
        return None

    def apply_content(self, content_delta: int, data: bytes | memoryview) -> None:
        if content_delta != self.delta:
            raise ContentDeltaMismatch(
                f"{self.journal}: content_delta {content_delta}, expected {self.delta}")
        if not data:
            return
        if self._file is None:
            # Lazily: an idle journal costs no file and no fd.
            self._file = self._files.create(self.journal, self.fragment.begin)
        self._file.write_at(self.content_length + self.delta, data)
        self._hasher.update(data)
        self.delta += len(data)
        self._next = None  # (a rollback then as much new content has the same delta)

    def apply_proposal(self, msg: ReplicateProposal, *, primary: bool = False,
                       epoch: int = 0) -> ReplicateResponse:
        """`epoch`: the revision of the route this proposal comes under (a commit
        adopted here records it)."""
        prop = msg.proposal
        if prop.journal != self.journal:
            return self._mismatch()
        cut = self._stale_cut(msg)
        if cut is not None:
            self._cut_stale_tail(cut)
        end = self.fragment.end
        if prop.end > end + self.delta and 0 < msg.epoch < self.epoch:
            # A proposer whose content is of an older epoch than ours must not roll us
            # forward past content acknowledged since: it learns our epoch instead.
            return self._mismatch()
        if prop.end > end + self.delta or (prop.end == end and prop.begin == prop.end):
            self._roll(prop, msg.registers, primary, msg.producers)
            if msg.epoch > self.epoch:
                self._set_epochs(msg.epochs or ((msg.epoch, msg.epoch_begin),))

        if prop == self.fragment and msg.registers == self.registers:
            self._rollback()
            if msg.mark is not None:
                self.producers.apply(msg.mark)  # a barrier that closes a history
            return OK

        if self.delta != 0 and prop == self.next():
            self._commit(prop, msg.registers, primary)
            if epoch and epoch != self.epoch:
                older = self.epochs if epoch > self.epoch else ()
                self._set_epochs((*older[-(MAX_EPOCHS - 1):], (epoch, end)))
            if msg.mark is not None:
                self.producers.apply(msg.mark)
            return OK
        return self._mismatch()

    def rollback(self) -> None:
        """Drop uncommitted content (a replicate stream ended mid-append)."""
        self._rollback()

    def drop_after(self, end: int) -> bool:
        """Forget committed content past `end`: a superseded primary's commits that not
        every peer acknowledged (fence.py). The SHA-1 is recomputed from the file."""
        self._rollback()
        frag = self.fragment
        end = max(frag.begin, min(end, frag.end))
        if end == frag.end:
            return False
        self.producers.drop_after(end)
        hasher = _EMPTY_SHA1.copy()
        if self._file is not None:
            for pos in range(0, end - frag.begin, 1 << 20):
                hasher.update(self._file.read_at(pos, min(1 << 20, end - frag.begin - pos)))
            self._file.truncate(end - frag.begin)
        self.fragment = Fragment(journal=self.journal, begin=frag.begin, end=end,
                                 sum=hasher.hexdigest() if end > frag.begin else EMPTY_SUM,
                                 codec=frag.codec)
        self._hasher, self._saved = hasher, hasher.copy()
        return True

    def close(self, primary: bool = False) -> None:
        """Finish the current fragment (replica shutdown / journal dropped)."""
        self._roll(self.roll_proposal().proposal, self.registers, primary)

    # -- internals --------------------------------------------------------------------

    def _mismatch(self) -> ReplicateResponse:
        return ReplicateResponse(status=Status.PROPOSAL_MISMATCH, fragment=self.fragment,
                                 registers=self.registers, producers=self.producers.snapshot(),
                                 epoch=self.epoch, epoch_begin=self.epoch_begin,
                                 epochs=self.epochs)

    def _set_epochs(self, epochs: tuple[tuple[int, int], ...]) -> None:
        self.epochs = epochs
        self.epoch, self.epoch_begin = epochs[-1] if epochs else (0, self.fragment.begin)

    def _stale_cut(self, msg: ReplicateProposal) -> int | None:
        """Where our stale tail begins, if we hold one: a synchronizing proposal from a
        newer epoch than our last commit's says where each of its epochs begins, and our
        content past the begin of the first epoch after ours is a tail no later route
        acknowledged (module docstring; Kafka's KIP-279). None: nothing to cut. Only
        sync proposals carry an epoch."""
        if not 0 < self.epoch < msg.epoch:
            return None
        history = msg.epochs or ((msg.epoch, msg.epoch_begin),)
        at = next((b for e, b in history if e > self.epoch), msg.epoch_begin)
        return at if at < self.fragment.end else None

    def _cut_stale_tail(self, at: int) -> None:
        """Truncate our committed content to `at`, or — when the open fragment begins
        at or past that offset — discard it (never closed: not served, not persisted)
        and restart empty at `at`; the observer's `on_discarded` hears of the cut
        (closed fragments past it are the observer's to drop). Epochs whose content
        began at or past `at` are gone from our history with it."""
        cut = self.fragment
        if at > cut.begin:
            self.drop_after(at)
        else:
            self._rollback()
            if self._file is not None:
                self._file.discard()
            self.producers.drop_after(at)
            self._restart_empty(at, cut.codec)
        self._set_epochs(tuple((e, b) for e, b in self.epochs if b < at))
        on_discarded = getattr(self._observer, "on_discarded", None)
        if on_discarded is not None:
            on_discarded(self, cut, at)

    def _rollback(self) -> None:
        if self.delta:
            self.delta = 0
            self._hasher = self._saved.copy()
            if self._file is not None:
                self._file.truncate(self.content_length)

    def _commit(self, prop: Fragment, registers: LabelSet, primary: bool) -> None:
        self.fragment = prop
        self.registers = registers
        self.delta = 0
        self._saved = self._hasher.copy()
        if not self.first_append_time:
            self.first_append_time = self._clock()
        self._observer.on_commit(self, prop, primary)

    def _roll(self, prop: Fragment, registers: LabelSet, primary: bool,
              producers: ProducerSnapshot | None = None) -> None:
        self._rollback()
        old, file = self.fragment, self._file
        if old.end != old.begin:
            if file is not None:
                file.seal(old)
            self._observer.on_closed(self, old, file, primary)
        elif file is not None:
            file.discard()
        if prop.end > old.end:
            # Only a proposal strictly ahead carries registers we do not know.
            self.registers = registers
            if producers is not None:
                self.producers.restore(producers)
        self._restart_empty(prop.end, prop.codec)

    def _restart_empty(self, at: int, codec: Codec) -> None:
        """An empty fragment at `at`, no file, fresh SHA-1 (after a roll or a cut)."""
        self.fragment = Fragment(journal=self.journal, begin=at, end=at, sum=EMPTY_SUM,
                                 codec=codec)
        self.delta = 0
        self._hasher = _EMPTY_SHA1.copy()
        self._saved = _EMPTY_SHA1.copy()
        self._file = None
        self.first_append_time = 0.0
