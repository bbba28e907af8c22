"""CeleryPersister bookkeeping that needs no Redis: pending, lag, coverage, replica delay."""

from __future__ import annotations

from coordinator.persister import CeleryPersister
from protocol import Fragment


def frag(begin: int, end: int, journal: str = "acme/book") -> Fragment:
    return Fragment(journal=journal, begin=begin, end=end, sum=f"{begin:040x}")


def make(**kw) -> CeleryPersister:
    return CeleryPersister("redis://127.0.0.1:1/0", endpoints=lambda f: [], store_for=lambda j: None, **kw)


def test_pending_is_dropped_only_when_one_persisted_fragment_covers_it() -> None:
    p = make()
    for f in (frag(0, 100), frag(100, 200), frag(200, 300), frag(0, 50, "acme/other")):
        p.closed(f)
    p.closed(frag(5, 5))  # empty: never persisted
    p.closed(frag(0, 100))  # duplicate close
    assert p.lag()["acme/book"].fragments == 3 and p.lag()["acme/book"].bytes == 300

    # [0, 150) covers [0, 100); [100, 200) is only half covered by it.
    assert p.mark_persisted("acme/book", [frag(0, 150), frag(250, 260)]) == [frag(0, 100)]
    assert p.mark_persisted("acme/book", [frag(100, 120), frag(120, 200)]) == []
    assert p.mark_persisted("acme/book", [frag(50, 400)]) == [frag(100, 200), frag(200, 300)]
    assert set(p.lag()) == {"acme/other"}
    assert p.forget("acme/other") == 1 and p.pending() == []
    p.close()


def test_replicas_wait_before_sending_but_primaries_do_not() -> None:
    p = make(is_primary=lambda j: j == "acme/mine", replica_delay=120)
    p.closed(frag(0, 10, "acme/mine"))
    p.closed(frag(0, 10, "acme/theirs"))
    p.closed(frag(10, 20, "acme/theirs"), primary=True)  # explicit flag wins
    due = {(x.fragment.journal, x.fragment.begin): x.due for x in p._pending.values()}
    assert due[("acme/theirs", 0)] - due[("acme/mine", 0)] > 100
    assert abs(due[("acme/theirs", 10)] - due[("acme/mine", 0)]) < 5
    p.close()
