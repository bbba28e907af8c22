"""A Replica: one journal hosted by this coordinator.

It owns the journal's Spool and the two ownership tokens of the seed — `spool_lock`
(one Append/Replicate owner of the spool at a time) and `pipeline_lock` (the send side
of the primary's pipeline) — plus what readers need: the published write head, the
closed local fragments still on disk, and the remote fragment index.

Idle journals must be cheap, so a Replica starts no task and opens no file: the spool
file is opened on the first content byte (the spare the host had made for it on a
thread, spool_spares.py, renamed into place), and the reader wake-up future only exists
while someone waits.

Visibility: a replica publishes a commit as soon as its spool adopts it (the primary
only proposes a commit after the append's content reached every peer). The primary
publishes only after every peer acknowledged (pipeline.py), so a reader at the
primary never sees bytes that a failed append left on it alone.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.logs import get_logger
from protocol import Fragment

from .flow_control import RateLimiter
from .lineage import lineage_agrees_until
from .owner_locks import PipelineLock, acquire_within
from .spool import FileFactory, Spool, SpoolFile

log = get_logger(__name__)

# Re-exported: other modules and tests import these from here.
__all__ = ["LocalFragment", "LocalPersister", "Persister", "PipelineLock", "Replica",
           "acquire_within", "lineage_agrees_until"]


class Persister(Protocol):
    """Receives closed fragments. The workers engineer's CeleryPersister implements it."""

    async def on_closed(self, fragment: Fragment, path: str | None) -> None: ...


class LocalPersister:
    """Default: keep the file on local disk and log (persistence happens elsewhere)."""

    async def on_closed(self, fragment: Fragment, path: str | None) -> None:
        log.info("fragment closed; kept locally", journal=fragment.journal,
                 begin=fragment.begin, end=fragment.end, path=path)


@dataclass(slots=True)
class LocalFragment:
    fragment: Fragment
    file: SpoolFile | None


class Replica:
    __slots__ = ("journal", "spool", "spool_lock", "pipeline_lock", "pipeline", "head",
                 "local", "remote", "index_ready", "_wake", "_on_closed", "_log",
                 "_pulse_pending", "resolution", "limiter", "stream",
                 "synced_end", "exposed_end", "lane", "batch", "health", "retired",
                 "stale_from")

    def __init__(self, journal: str, files: FileFactory,
                 on_closed: Callable[[Fragment, str | None, bool], None] | None = None) -> None:
        self.journal = journal
        self.spool = Spool(journal, files=files, observer=self)
        self.health = getattr(files, "health", None)
        """The process's spool_health.SpoolHealth (None with memory files)."""
        self.spool_lock = asyncio.Lock()
        self.pipeline_lock = PipelineLock()
        # Any, not None: mypyc-compiled readers (append_lane) trust an attribute's type,
        # and naming Pipeline/Batch here would be an import circle (docs/compiled.md).
        self.pipeline: Any = None  # a pipeline.Pipeline while we are primary and synced
        self.head = 0
        """Published write head: readers see bytes below it (and nothing beyond)."""
        self.local: list[LocalFragment] = []
        """Closed fragments still on local disk, in offset order."""
        self.remote: tuple[Fragment, ...] = ()
        """The persisted covering set (from the index workers), in offset order."""
        self.index_ready = False
        self._wake: asyncio.Future[None] | None = None
        self._on_closed = on_closed
        self._log = log.bind(journal=journal)
        self._pulse_pending = False
        self.resolution: Any = None
        """The append FSM's last primary resolution (reused while the keyspace is still)."""
        self.lane: tuple[object, object] | None = None
        """(resolution, pipeline) the whole-append lane last found its route checks true
        for (append_lane.py): they hold while both are the same objects."""
        self.batch: Any = None
        """The lane's open group commit (append_lane.Batch), from its first append to
        the end of that loop turn; it holds pipeline_lock meanwhile."""
        self.limiter: RateLimiter | None = None
        """The journal's max_append_rate bucket (only while the spec sets one)."""
        self.synced_end = 0
        """The spool's end at the last synchronization a primary's stream proved (a
        replica rolled forward by a sync holds no bytes of the gap it skipped, so this
        raises the reported write head without making the gap look unwritten)."""
        self.stream: tuple[Any, Any] | None = None
        """(fence.StreamFence, FrameStream or mux channel) of the replicate stream holding
        the spool (annotated: the compiled replicate_api reads it, docs/compiled.md)."""
        self.retired = False
        """The assignment went away (retire()) and has not come back: fragments closed
        now are a former member's, checked against the route before they are persisted
        (retired_check.py)."""
        self.stale_from: int | None = None
        """The lowest offset where a fragment of ours was found to disagree with the
        journal (drop_stale): a head remembered for this journal never reaches past it."""
        self.exposed_end = 0
        """The spool's end when we, as primary, last sent it in a sync proposal: peers
        behind it roll forward past it on receipt (without its bytes), so from then on
        it is part of the journal and must never be dropped as unacknowledged."""

    # -- spool observer ---------------------------------------------------------------

    def on_commit(self, spool: Spool, fragment: Fragment, primary: bool) -> None:
        if not primary:
            self.publish(fragment.end)

    def on_discarded(self, spool: Spool, fragment: Fragment, at: int) -> None:
        """A sync from a newer epoch cut our content past `at` (an old route's
        unacknowledged tail; spool.py): what we published of it is withdrawn, and closed
        fragments still on disk that reach past it are dropped (they hold stale bytes;
        the journal's other members hold the acknowledged ones, read through a gap)."""
        self.head = min(self.head, at)
        self.synced_end = min(self.synced_end, at)
        self.exposed_end = min(self.exposed_end, at)
        stale = [lf for lf in self.local if lf.fragment.end > at]
        for lf in stale:
            if lf.file is not None:
                lf.file.discard()
        self.local = [lf for lf in self.local if lf.fragment.end <= at]
        self._log.warning("stale tail cut in sync", fragment_begin=fragment.begin,
                          fragment_end=fragment.end, cut_at=at,
                          closed_fragments_dropped=[(lf.fragment.begin, lf.fragment.end)
                                                    for lf in stale])
        self.wake()

    def on_closed(self, spool: Spool, fragment: Fragment, file: SpoolFile | None,
                  primary: bool) -> None:
        self.local.append(LocalFragment(fragment, file))
        self._log.info("fragment closed", fragment_begin=fragment.begin,
                       fragment_end=fragment.end, sum=fragment.sum, primary=primary)
        if self._on_closed is not None:
            self._on_closed(fragment, file.path if file else None, primary)
        self._drop_persisted()
        self.wake()  # a draining coordinator waits for its primaries' exit rolls

    # -- publication and waiting ------------------------------------------------------

    def publish(self, end: int) -> None:
        if end > self.head:
            self.head = end
            self.wake()

    def wake(self) -> None:
        if self._wake is not None:
            if not self._wake.done():
                self._wake.set_result(None)
            self._wake = None

    def changed(self) -> asyncio.Future[None]:
        """A future resolved at the next head move or index change. Made *now*, so a
        change between this call and the caller's await is not missed (a coroutine that
        made it on its first step could be scheduled after the change). Shared by every
        waiter: await it through asyncio.shield or asyncio.wait, never cancel it."""
        if self._wake is None:
            self._wake = asyncio.get_running_loop().create_future()
        return self._wake

    async def wait_change(self, timeout: float | None = None) -> None:
        """Block until the head moves or the index changes (never polls)."""
        fut = self.changed()
        if timeout is None:
            await asyncio.shield(fut)
        else:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(fut)
            except TimeoutError:
                pass

    # -- the remote index -------------------------------------------------------------

    def set_remote_index(self, fragments: Sequence[Fragment]) -> None:
        """Replace the persisted covering set (called by coordinator/index_watch.py)."""
        self.remote = tuple(sorted((f for f in fragments if f.end > f.begin),
                                   key=lambda f: (f.begin, f.end)))
        self.index_ready = True
        self._drop_persisted()
        self.wake()

    def index_loaded(self) -> None:
        """The index source answered for this journal (maybe: no index yet)."""
        if not self.index_ready:
            self.index_ready = True
            self.wake()

    @property
    def index_end(self) -> int:
        """The journal's furthest known offset outside the spool: persisted fragments
        and closed ones on local disk (after a restart these may be the only record of
        offsets already written, which must never be written again)."""
        end = self.remote[-1].end if self.remote else 0
        return max(end, self.local[-1].fragment.end) if self.local else end

    def adopt_local(self, fragments: Sequence[LocalFragment]) -> None:
        """Closed fragments recovered from disk (a previous run): readable and kept
        until the index shows them persisted."""
        if fragments:
            self.local = sorted([*fragments, *self.local], key=lambda lf: lf.fragment.begin)
            self._drop_persisted()

    def resume_at(self, head) -> None:  # noqa: ANN001 - a recovery.Head
        """Start a fresh, empty spool at the write head a graceful exit recorded (with
        its registers): every offset below it was written, and committed here, so it
        is published as a commit is (readers see it from the closed local fragments or
        the store). Never moves a spool back."""
        spool = self.spool
        if head.end <= spool.end or spool.content_length or spool.delta:
            return
        resp = spool.apply_proposal(spool.roll_proposal(head.end, codec=head.codec,
                                                        registers=head.registers,
                                                        producers=getattr(head, "producers", None)))
        self.publish(spool.end)
        self._log.info("spool resumed at the recorded write head", end=head.end,
                       status=resp.status.name)

    def _drop_persisted(self) -> None:
        # A closed local fragment is deleted only once the index shows its whole span
        # persisted: until then it is the only copy this replica can serve or re-send.
        if not self.remote:
            return
        kept: list[LocalFragment] = []
        for lf in self.local:
            if self._covered(lf.fragment):
                if lf.file is not None:
                    lf.file.discard()
                self._log.debug("local fragment persisted; dropped", fragment_begin=lf.fragment.begin)
            else:
                kept.append(lf)
        self.local = kept

    def _covered(self, frag: Fragment) -> bool:
        return any(r.begin <= frag.begin and frag.end <= r.end for r in self.remote)

    # -- reads ------------------------------------------------------------------------

    @property
    def write_head(self) -> int:
        """The synchronized state: what was published, proven by a pipeline sync, or is
        known to the index (never a stale head after a roll forward)."""
        return max(self.head, self.synced_end, self.index_end)

    def note_synced(self, end: int) -> None:
        if end > self.synced_end:
            self.synced_end = end
            self.wake()

    def lookup(self, offset: int) -> tuple[Fragment, LocalFragment | None] | None:
        """The fragment serving `offset`: a readable local one first, then the store.

        The returned fragment is clipped to the published head so uncommitted (or, at
        the primary, not yet acknowledged) bytes are never handed out.
        """
        if offset < self.head:
            spool = self.spool.fragment
            if spool.begin <= offset < spool.end:
                return spool, None
            for lf in self.local:
                if lf.fragment.begin <= offset < lf.fragment.end:
                    return lf.fragment, lf
        begins = [f.begin for f in self.remote]
        i = bisect.bisect_right(begins, offset) - 1
        if i >= 0 and self.remote[i].end > offset:
            # Longest tail: a later fragment that also covers offset reaches further.
            while i + 1 < len(self.remote) and self.remote[i + 1].begin <= offset:
                i += 1
            return self.remote[i], None
        return None

    def next_offset_after_gap(self, offset: int) -> int | None:
        """First readable offset > `offset` when `offset` fell in a gap left by a roll."""
        starts = [lf.fragment.begin for lf in self.local if lf.fragment.begin > offset]
        starts += [f.begin for f in self.remote if f.begin > offset]
        if self.spool.fragment.begin > offset and self.spool.fragment.begin < self.head:
            starts.append(self.spool.fragment.begin)
        return min(starts) if starts else None

    def read_local(self, frag: Fragment, local: LocalFragment | None, offset: int,
                   size: int) -> bytes:
        end = min(frag.end, self.head) if local is None else frag.end
        size = min(size, end - offset)
        if size <= 0:
            return b""
        if local is None:
            if self.spool.fragment.begin != frag.begin:
                return b""  # the spool rolled under us; the caller looks up again
            return self.spool.read_committed(offset, size)
        if local.file is None:
            return b""
        return local.file.read_at(offset - frag.begin, size)

    def local_file(self, frag: Fragment) -> LocalFragment | None:
        for lf in self.local:
            if (lf.fragment.begin, lf.fragment.end, lf.fragment.sum) == (frag.begin, frag.end, frag.sum):
                return lf
        return None

    def cached_resolution(self, revision: int, min_revision: int = 0):  # noqa: ANN201
        """The append FSM's last primary resolution while the keyspace is at its revision.

        A resolution is a function of the keyspace mirror at one revision, so while the
        mirror is still at the revision it was made at (and the request asks for nothing
        later), resolving again would give the same answer. None otherwise.
        """
        res = self.resolution
        if res is None or res.header.etcd.revision != revision or min_revision > revision:
            return None
        return res

    def limiter_for(self, rate: int) -> RateLimiter | None:
        """The bucket for the spec's current max_append_rate (None: unlimited)."""
        if rate <= 0:
            self.limiter = None
        elif self.limiter is None or self.limiter.rate != rate:
            self.limiter = RateLimiter(rate)
        return self.limiter

    def retire(self) -> bool:
        """The assignment went away: close the spool's committed content as a fragment
        (handed to the persister at once, kept on disk and readable/fetchable until the
        index shows it persisted) instead of dropping it, and keep the spool's offset.
        The caller holds (or checked free) the spool lock. True while something remains
        that only this replica may hold (closed fragments not yet persisted)."""
        spool = self.spool
        self.retired = True
        self.drop_unacknowledged()
        if spool.content_length:
            spool.close(primary=True)  # primary: persist now, we may be the last copy
            self._log.info("assignment gone; spool closed for persistence", end=spool.end)
        return bool(self.local)

    def drop_stale(self, fragment: Fragment, at: int) -> bool:
        """A closed fragment whose bytes from `at` differ from the journal's (a tail a
        later epoch cut and rewrote, retired_check.py): dropped, never persisted. True if
        it was still here."""
        kept = [lf for lf in self.local if lf.fragment != fragment]
        gone = [lf for lf in self.local if lf.fragment == fragment]
        for lf in gone:
            if lf.file is not None:
                lf.file.discard()
        self.local = kept
        self.stale_from = at if self.stale_from is None else min(self.stale_from, at)
        self.head = min(self.head, at)
        self.wake()
        return bool(gone)

    def expose(self, end: int) -> None:
        """We (primary) send our spool's end `end` in a sync proposal (exposed_end)."""
        self.exposed_end = max(self.exposed_end, end)

    def drop_unacknowledged(self) -> None:
        """A replica publishes every commit it adopts, a primary only acknowledged ones:
        spool content past the published head is a (former) primary's commits that not
        every peer acknowledged. Called when another stream takes the spool, or on
        retirement (the caller owns the spool): the content is dropped (fence.py) —
        except what a sync proposal of ours exposed: peers rolled forward past it on
        receipt, without its bytes, and the producer table it carried may already
        answer a re-sent transaction with it (chaos campaign seed 13)."""
        spool = self.spool
        keep = max(self.head, self.exposed_end)
        if spool.end > keep and spool.content_length:
            before = spool.end
            if spool.drop_after(keep):
                self._log.warning("dropped unacknowledged commits of a superseded primary",
                                  begin=max(keep, spool.begin), end=before)

    def close(self) -> None:
        """Release files (the replica left this coordinator)."""
        self.wake()
        for lf in self.local:
            if lf.file is not None and lf.file.path is None:
                lf.file.discard()
