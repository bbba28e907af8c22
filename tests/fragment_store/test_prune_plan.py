"""The pure prune planner: age, persistence, head and guard rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fragment_store.prune import plan_prune, removable
from protocol import Fragment

NOW = 1_000_000.0


def frag(begin: int, end: int, mod_time: int = 100, store: str = "file:///s/") -> Fragment:
    return Fragment(journal="a/b", begin=begin, end=end, sum="0" * 40,
                    backing_store=store, mod_time=mod_time)


def test_old_fragments_go_young_ones_stay() -> None:
    old, young, head = frag(0, 10, mod_time=100), frag(10, 20, mod_time=int(NOW) - 5), frag(20, 30)
    plan = plan_prune([head, young, old], now=NOW, retention=60, head=30)
    assert plan.remove == (old,)
    assert plan.keep == (young, head)
    assert plan.first_retained == 10


def test_unpersisted_fragment_is_never_planned() -> None:
    local = frag(0, 10, mod_time=0, store="")
    assert not removable(local, now=NOW, retention=1, head=100)


def test_fragment_holding_the_head_stays() -> None:
    assert not removable(frag(0, 10), now=NOW, retention=1, head=10)
    assert removable(frag(0, 10), now=NOW, retention=1, head=11)


def test_guard_offset_is_the_ceiling() -> None:
    assert not removable(frag(0, 10), now=NOW, retention=1, head=100, guard=9)
    assert removable(frag(0, 10), now=NOW, retention=1, head=100, guard=10)


def test_zero_retention_keeps_forever() -> None:
    assert not removable(frag(0, 10), now=NOW, retention=0, head=100)


def test_age_must_exceed_retention() -> None:
    assert not removable(frag(0, 10, mod_time=940), now=1000, retention=60, head=100)
    assert removable(frag(0, 10, mod_time=939), now=1000, retention=60, head=100)


spans = st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200), st.integers(0, 2000),
                           st.booleans()), max_size=30)


@given(spans, st.integers(0, 1300), st.none() | st.integers(0, 1300), st.integers(0, 500))
def test_every_planned_fragment_obeys_every_rule(raw, head, guard, retention) -> None:  # type: ignore[no-untyped-def]
    frags = [frag(b, b + n, m, "file:///s/" if p else "") for b, n, m, p in raw]
    plan = plan_prune(frags, now=2000, retention=retention, head=head, guard=guard)
    key = lambda f: (f.begin, f.end, f.mod_time, f.backing_store)  # noqa: E731
    assert sorted(plan.remove + plan.keep, key=key) == sorted(frags, key=key)
    for f in plan.remove:
        assert f.is_persisted and f.mod_time + retention < 2000 and retention > 0
        assert f.end < head and (guard is None or f.end <= guard)
    for f in plan.keep:
        assert not removable(f, now=2000, retention=retention, head=head, guard=guard)


def test_recovery_log_is_pruned_up_to_its_snapshot_whatever_its_age() -> None:
    young = frag(0, 10, mod_time=int(NOW) - 1)
    # Retention 0 and a young fragment: kept by the age rule, gone as a recovery log
    # once the newest snapshot (the guard) covers it.
    assert not removable(young, now=NOW, retention=0, head=100, guard=10)
    assert removable(young, now=NOW, retention=0, head=100, guard=10, recovery_log=True)
    # Not yet covered by a snapshot, no snapshot at all, unpersisted, or the head: kept.
    assert not removable(young, now=NOW, retention=0, head=100, guard=9, recovery_log=True)
    assert not removable(young, now=NOW, retention=0, head=100, guard=None, recovery_log=True)
    assert not removable(frag(0, 10, store=""), now=NOW, retention=0, head=100, guard=50,
                         recovery_log=True)
    assert not removable(young, now=NOW, retention=0, head=10, guard=50, recovery_log=True)


@given(spans, st.integers(0, 1300), st.none() | st.integers(0, 1300), st.integers(0, 500))
def test_a_recovery_log_never_loses_what_its_snapshot_does_not_cover(  # type: ignore[no-untyped-def]
        raw, head, guard, retention) -> None:
    frags = [frag(b, b + n, m, "file:///s/" if p else "") for b, n, m, p in raw]
    plan = plan_prune(frags, now=2000, retention=retention, head=head, guard=guard,
                      recovery_log=True)
    for f in plan.remove:
        assert f.is_persisted and f.end < head and guard is not None and f.end <= guard
