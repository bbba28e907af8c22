"""Epoch lineage: where two members' epoch histories of one journal stop agreeing, so a
gap read takes from a peer only the bytes both hold under the same epoch (split from
replica.py, which re-exports it)."""

from __future__ import annotations


def lineage_agrees_until(mine: tuple[tuple[int, int], ...], theirs: tuple[tuple[int, int], ...],
                         offset: int, end: int) -> int:
    """The first offset in [offset, end) where two epoch histories ((epoch, begin) pairs,
    begins ascending) put different epochs — or either has none (an offset older than
    its oldest entry) — or `end` if they agree throughout. Content committed at one
    offset under one epoch is the same content wherever it is held (one route revision,
    one primary); a member's tail that a later epoch cut and rewrote is not."""

    def epoch_at(history: tuple[tuple[int, int], ...], at: int) -> int | None:
        found = None
        for epoch, begin in history:
            if begin > at:
                break
            found = epoch
        return found

    points = sorted({offset, *(b for _, b in (*mine, *theirs) if offset < b < end)})
    for at in points:
        here = epoch_at(mine, at)
        if here is None or here != epoch_at(theirs, at):
            return at
    return end
