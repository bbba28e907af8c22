"""The fragment index: a journal's covering set of fragments (pure, no IO).

Theory of operation
-------------------
Replicas roll fragments at different moments, retries re-persist, and a store may hold
both `[0, 100)` and `[0, 40)` + `[40, 100)`. Readers need, for each offset, one fragment
to read it from — the one with the most content after the offset, so they switch objects
as rarely as possible. That is Gazette's CoverSet:

* Entries are ordered by begin *and* end, and no entry is covered by another
  (covered = other.begin <= f.begin and f.end <= other.end). Together these make both
  begins and ends strictly increasing, so everything is a bisect away.
* `add(f)` ignores an empty fragment and one already covered by an entry (on an exact
  tie the entry already present wins — add remote fragments first to prefer them), and
  otherwise removes every entry `f` covers and inserts `f`. The result therefore does not
  depend on insertion order, except for which of two same-span fragments is kept.
* `lookup(offset)` takes the first entry whose end > offset, then advances while the
  next entry's begin <= offset: among the entries covering the offset, the one with the
  greatest end. If the first candidate begins after the offset, the offset lies in a
  gap (not yet persisted, or pruned) and lookup returns None; `next_after(offset)`
  names the fragment a reader could skip ahead to.
* `merge(remote, local)` is the index refresh: the store listing is authoritative, local
  (not yet persisted) fragments survive only where no remote fragment covers them.

The set serializes as a JSON list of Fragment (msgspec): the Redis value
`quire:index:<journal>`, and the `fragments` of the store manifest (manifest.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

import msgspec

from protocol import Fragment, ValidationError

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(list[Fragment])


class CoverSet:
    """Fragments of one journal, no entry covered by another, ordered by offset."""

    __slots__ = ("_frags", "_begins", "_ends")

    def __init__(self, fragments: Iterable[Fragment] = ()) -> None:
        self._frags: list[Fragment] = []
        self._begins: list[int] = []
        self._ends: list[int] = []
        for f in fragments:
            self.add(f)

    # -- building ---------------------------------------------------------------------

    def add(self, fragment: Fragment) -> bool:
        """Insert unless empty or covered; drop entries it covers. True if inserted."""
        if fragment.end <= fragment.begin:
            return False
        # The entry beginning at or before fragment.begin with the greatest end is the
        # only one that could cover it (ends increase with begins).
        j = bisect.bisect_right(self._begins, fragment.begin) - 1
        if j >= 0 and self._ends[j] >= fragment.end:
            return False
        lo = bisect.bisect_left(self._begins, fragment.begin)
        hi = bisect.bisect_right(self._ends, fragment.end, lo=lo)
        self._frags[lo:hi] = [fragment]
        self._begins[lo:hi] = [fragment.begin]
        self._ends[lo:hi] = [fragment.end]
        return True

    def copy(self) -> CoverSet:
        out = CoverSet()
        out._frags, out._begins, out._ends = list(self._frags), list(self._begins), list(self._ends)
        return out

    # -- queries ----------------------------------------------------------------------

    def lookup(self, offset: int) -> Fragment | None:
        """The fragment covering `offset` with the most content after it, or None."""
        i, found = self.find(offset)
        return self._frags[i] if found else None

    def find(self, offset: int) -> tuple[int, bool]:
        """Gazette's LongestOverlappingFragment: (index, found). If not found, index is
        the first fragment after `offset` (== len(self) when there is none)."""
        i = bisect.bisect_right(self._ends, offset)
        if i == len(self._frags) or self._begins[i] > offset:
            return i, False
        while i + 1 < len(self._frags) and self._begins[i + 1] <= offset:
            i += 1
        return i, True

    def next_after(self, offset: int) -> Fragment | None:
        """The first fragment ending after `offset` (covering it, or the next one)."""
        i = bisect.bisect_right(self._ends, offset)
        return self._frags[i] if i < len(self._frags) else None

    @property
    def begin_offset(self) -> int:
        return self._begins[0] if self._frags else 0

    @property
    def end_offset(self) -> int:
        """The offset one past the last indexed byte (0 when empty)."""
        return self._ends[-1] if self._frags else 0

    def gaps(self) -> list[tuple[int, int]]:
        """Offset ranges [a, b) between begin_offset and end_offset no fragment covers."""
        out: list[tuple[int, int]] = []
        reach = self.begin_offset
        for f in self._frags:
            if f.begin > reach:
                out.append((reach, f.begin))
            reach = max(reach, f.end)
        return out

    def select(self, begin_mod_time: int = 0, end_mod_time: int = 0) -> list[Fragment]:
        """Fragments in a mod-time window (ListFragments): excluded are those with
        mod != 0 and mod < begin, or (end != 0 and (mod == 0 or mod > end))."""
        return [f for f in self._frags
                if not (f.mod_time and f.mod_time < begin_mod_time)
                and not (end_mod_time and (f.mod_time == 0 or f.mod_time > end_mod_time))]

    def __iter__(self) -> Iterator[Fragment]:
        return iter(self._frags)

    def __len__(self) -> int:
        return len(self._frags)

    def __getitem__(self, i: int) -> Fragment:
        return self._frags[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CoverSet) and self._frags == other._frags

    def __repr__(self) -> str:
        spans = ", ".join(f"[{f.begin}, {f.end})" for f in self._frags[:8])
        more = f", … {len(self._frags) - 8} more" if len(self._frags) > 8 else ""
        return f"CoverSet({spans}{more})"

    # -- serialization ----------------------------------------------------------------

    def to_json(self) -> bytes:
        return _ENCODER.encode(self._frags)

    @classmethod
    def from_json(cls, data: bytes | str, journal: str | None = None) -> CoverSet:
        """Decode (and validate) a JSON list of Fragment; ValidationError if malformed."""
        try:
            fragments = _DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValidationError("index", f"not a JSON list of fragments: {exc}") from None
        for i, f in enumerate(fragments):
            f.validate(f"index[{i}]")
            if journal is not None and f.journal != journal:
                raise ValidationError(f"index[{i}].journal", f"{f.journal!r} is not {journal!r}")
        return cls(fragments)


def merge(remote: Iterable[Fragment], local: Iterable[Fragment]) -> CoverSet:
    """The index after a refresh: every remote (store) fragment, plus local fragments no
    remote one covers. On equal spans the remote fragment wins."""
    out = CoverSet(remote)
    for f in local:
        out.add(f)
    return out


def encode_index(fragments: Iterable[Fragment]) -> bytes:
    """JSON of a covering set (the Redis value)."""
    return CoverSet(fragments).to_json()


def decode_index(data: bytes | str, journal: str | None = None) -> CoverSet:
    return CoverSet.from_json(data, journal)
