"""Value types the client hands back (plain, frozen, printable)."""

from __future__ import annotations

import msgspec

from protocol import Fragment, LabelSet


class AppendResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where an append landed: bytes [begin, end) of `journal`.

    For an AppendService message future, begin/end are the message's own span and
    `commit` is the whole transactional batch it was committed in.
    """

    journal: str
    begin: int
    end: int
    commit: Fragment | None = None
    registers: LabelSet | None = None

    @property
    def size(self) -> int:
        return self.end - self.begin
