"""The producer table: which identified transactions a journal has acted on (pure).

Per journal, (producer, generation, history) -> the last transaction acted on and its
original commit (protocol.ProducerMark). The datastore seed's backend tracking
("Persistence model"): for a valid local history only its last transaction number is
kept, because the frontend allocates them in order, so it implies every earlier one.

`check()` is the primary's decision for an identified append (before any content is
written); `apply()` records a mark once a commit carrying it is adopted — on every
replica, in commit order, so all replicas of a journal hold the same table. No IO, no
clock: the only time is the mark's `at` (the primary's clock at commit), which drives
expiry identically everywhere.

Rules (docs/exactly-once.md):

* unknown history (never seen, expired or evicted): any txn is new;
* txn == last: a re-send of a transaction that committed — answered with the ORIGINAL
  commit, nothing written (also for the transaction that closed the history);
* txn == last + 1: new (unless the history is closed: HISTORY_CLOSED);
* txn > last + 1: TXN_OUT_OF_ORDER (skips ahead); txn < last: TXN_SUPERSEDED;
* a generation older than the producer's newest: PRODUCER_GENERATION_RETIRED; a mark
  of a newer generation drops every history of the older ones;
* closing a history keeps a tombstone (`closed`), refused with HISTORY_CLOSED.

Bounds: at most `limit` histories (tombstones included) and `limit` producers per
journal; an entry idle for longer than `expiry` seconds (by mark time) is dropped, and
past `limit` the least recently used is evicted first. Each entry is one small struct
(~0.3 KiB with its dict slot), so the default bound is ~0.6 MiB per journal at worst,
and a whole snapshot (<= ~0.5 MiB with 128-byte producer names) fits one frame header.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import Fragment, ProducerMark, ProducerSnapshot, Status
from protocol.errors import ValidationError
from protocol.producers import validate_identity

__all__ = ["DEFAULT_EXPIRY", "DEFAULT_LIMIT", "ProducerTable", "Verdict"]

DEFAULT_LIMIT = 2048
"""Histories (and producers) remembered per journal."""
DEFAULT_EXPIRY = 24 * 3600
"""Seconds of inactivity (by commit time) after which a history is forgotten (Gazette
prunes producers 24h older than the journal's newest)."""

Key = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The primary's decision for an identified append."""

    status: Status = Status.OK
    message: str = ""
    original: Fragment | None = None
    """Set for a re-sent transaction that already committed: answer it with this."""

    @property
    def new(self) -> bool:
        return self.status == Status.OK and self.original is None


NEW = Verdict()


class ProducerTable:
    __slots__ = ("journal", "limit", "expiry", "_gens", "_hists")

    def __init__(self, journal: str = "", *, limit: int = DEFAULT_LIMIT,
                 expiry: float = DEFAULT_EXPIRY) -> None:
        self.journal = journal
        self.limit = max(1, limit)
        self.expiry = expiry
        self._gens: dict[str, tuple[int, int]] = {}
        """producer -> (newest generation, at); insertion order = least recent first."""
        self._hists: dict[Key, ProducerMark] = {}
        """(producer, generation, history) -> last mark; least recently used first."""

    def __len__(self) -> int:
        return len(self._hists)

    def __bool__(self) -> bool:
        return bool(self._gens)

    def get(self, producer: str, generation: int, history: int) -> ProducerMark | None:
        return self._hists.get((producer, generation, history))

    def generation(self, producer: str) -> int:
        g = self._gens.get(producer)
        return g[0] if g is not None else 0

    # -- the primary's decision ------------------------------------------------------

    def check(self, producer: str, generation: int, history: int, txn: int,
              close_history: bool = False) -> Verdict:
        m = self._hists.get((producer, generation, history))
        g = self._gens.get(producer)
        if m is not None and txn == m.txn + 1 and not m.closed and not close_history \
                and g is not None and g[0] == generation:
            # The common case, first: the next txn of a known history of the producer's
            # newest generation (its fields were valid when it was recorded).
            return NEW
        try:
            validate_identity(producer, generation, history, txn, close_history)
        except ValidationError as exc:
            return Verdict(Status.BAD_REQUEST, str(exc))
        if g is not None and generation < g[0]:
            return Verdict(Status.PRODUCER_GENERATION_RETIRED,
                           f"producer {producer!r} generation {generation} is retired: "
                           f"generation {g[0]} has started")
        if m is None:
            return NEW
        if txn == m.txn:
            return Verdict(original=Fragment(journal=self.journal, begin=m.begin, end=m.end,
                                             sum=m.sum))
        if m.closed:
            return Verdict(Status.HISTORY_CLOSED,
                           f"history {history} of producer {producer!r} generation "
                           f"{generation} was closed by txn {m.txn}")
        if txn == m.txn + 1:
            return NEW
        if txn > m.txn:
            return Verdict(Status.TXN_OUT_OF_ORDER,
                           f"txn {txn} skips ahead in history {history} of producer "
                           f"{producer!r} generation {generation}: the last acted on is "
                           f"{m.txn}, so the next must be {m.txn + 1} (or {m.txn}, a re-send)")
        return Verdict(Status.TXN_SUPERSEDED,
                       f"txn {txn} is behind history {history} of producer {producer!r} "
                       f"generation {generation}: txn {m.txn} was already acted on, so "
                       f"{txn} was too (its original commit is no longer kept)")

    # -- replicated state ------------------------------------------------------------

    def apply(self, mark: ProducerMark) -> None:
        """Record a mark whose proposal was adopted (every replica, in commit order)."""
        key = (mark.producer, mark.generation, mark.history)
        hists = self._hists
        old = hists.get(key)
        if old is not None and old.at == mark.at \
                and self._gens.get(mark.producer, (0, 0))[0] == mark.generation:
            # The hot path: a known history, again within the same second. Its place in
            # the LRU order stays right (nothing after it is older), its generation is
            # its producer's newest, and nothing new can have expired.
            hists[key] = mark
            return
        p, gen = mark.producer, mark.generation
        g = self._gens.pop(p, None)
        if g is None or gen > g[0]:
            # A newer generation retires every history of the older ones (seed); so
            # does a producer seen again after its entry was evicted.
            for old_key in [k for k in hists if k[0] == p and k[1] < gen]:
                del hists[old_key]
        self._gens[p] = (max(gen, g[0]) if g is not None else gen, mark.at)
        hists.pop(key, None)
        hists[key] = mark
        self._prune(mark.at)

    def _prune(self, now: int) -> None:
        cutoff = now - self.expiry
        hists, gens = self._hists, self._gens
        while hists:
            key, m = next(iter(hists.items()))
            if m.at >= cutoff and len(hists) <= self.limit:
                break
            del hists[key]
        while gens:
            p, (gen, at) = next(iter(gens.items()))
            if at >= cutoff and len(gens) <= self.limit:
                break
            del gens[p]

    def drop_after(self, end: int) -> int:
        """Forget marks of commits past `end` (a superseded primary's unacknowledged
        commits were dropped from the spool: Spool.drop_after). Their histories become
        unknown, so a re-send of the dropped transaction is written again, once."""
        gone = [k for k, m in self._hists.items() if m.end > end]
        for k in gone:
            del self._hists[k]
        return len(gone)

    # -- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> ProducerSnapshot:
        return ProducerSnapshot(
            generations=tuple((p, g, at) for p, (g, at) in self._gens.items()),
            marks=tuple(self._hists.values()))

    def restore(self, snap: ProducerSnapshot) -> None:
        """Replace the whole table (a roll forward to a peer's state, or a recorded head)."""
        self._gens = {p: (g, at) for p, g, at in snap.generations}
        self._hists = {(m.producer, m.generation, m.history): m for m in snap.marks}
        if len(self._hists) > self.limit or len(self._gens) > self.limit:
            newest = max((m.at for m in self._hists.values()), default=0)
            self._prune(newest)
