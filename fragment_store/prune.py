"""What may be pruned from a journal's fragments — pure planning, no IO.

A fragment is removable only when every guard agrees:

* it is persisted (`backing_store` set): a fragment still only on a replica's disk is
  never planned, whatever its age;
* its persisted age exceeds the journal's retention: `mod_time + retention < now`
  (retention 0 keeps fragments forever, as in Gazette);
* it ends strictly before the journal's write head, so the fragment holding the head
  (the last written byte) stays;
* it ends at or before the guard offset, the lowest offset a consumer shard or recovery
  log still needs (read by the adapter from etcd `<root>/guards/<journal>`; `None` means
  no guard). Retention is the floor, the guard is the ceiling.

A consumer shard's **recovery log** is pruned differently: everything its newest
snapshot covers (the guard offset the shard publishes) is dead weight whatever its age,
so with `recovery_log=True` a persisted fragment ending before the head and at or
before the guard goes at once, retention or not; without a guard nothing goes.

The plan is a list of fragments in offset order; the adapter deletes their objects
(idempotently: deleting an absent object is not an error) and refreshes the index.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from protocol import Fragment


class PrunePlan(NamedTuple):
    remove: tuple[Fragment, ...]
    """Fragments whose objects may be deleted, in offset order."""
    keep: tuple[Fragment, ...]
    """Every other fragment considered."""
    first_retained: int
    """The lowest begin offset among kept fragments (the offset a reader at 0 jumps to);
    the head if nothing is kept."""


def removable(fragment: Fragment, *, now: float, retention: float, head: int,
              guard: int | None = None, recovery_log: bool = False) -> bool:
    """True if every rule of the module docstring allows deleting `fragment`."""
    if not fragment.is_persisted or fragment.end >= head:
        return False
    if recovery_log:
        return guard is not None and fragment.end <= guard
    if retention <= 0 or fragment.mod_time + retention >= now:
        return False
    return guard is None or fragment.end <= guard


def plan_prune(fragments: Iterable[Fragment], *, now: float, retention: float, head: int,
               guard: int | None = None, recovery_log: bool = False) -> PrunePlan:
    """Split `fragments` into those that may be removed and those that must stay."""
    ordered = sorted(fragments, key=lambda f: (f.begin, f.end, f.sum))
    remove: list[Fragment] = []
    keep: list[Fragment] = []
    for f in ordered:
        (remove if removable(f, now=now, retention=retention, head=head, guard=guard,
                             recovery_log=recovery_log) else keep).append(f)
    first = min((f.begin for f in keep), default=head)
    return PrunePlan(tuple(remove), tuple(keep), first)
