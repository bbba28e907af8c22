"""The seeded fault schedule: deterministic, non-overlapping, inside the run."""

from __future__ import annotations

import pytest

from chaos.schedule import DEFAULT_KINDS, NET_MODES, FaultKind, ScheduleConfig, build_schedule, summarize


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = build_schedule(ScheduleConfig(duration=300, seed=42))
    b = build_schedule(ScheduleConfig(duration=300, seed=42))
    c = build_schedule(ScheduleConfig(duration=300, seed=43))
    assert a == b
    assert a != c


@pytest.mark.parametrize("duration", [60, 300, 900])
@pytest.mark.parametrize("seed", range(5))
def test_events_fit_and_do_not_overlap(duration: int, seed: int) -> None:
    cfg = ScheduleConfig(duration=duration, seed=seed, lease_ttl=5)
    events = build_schedule(cfg)
    assert events, "a run of a minute or more gets at least one fault"
    assert events[0].at >= cfg.warmup
    assert events[-1].ends <= duration - cfg.tail + 1e-6
    for prev, ev in zip(events, events[1:]):
        assert ev.at >= prev.ends
    for ev in events:
        assert 0 <= ev.journal < cfg.journals and 0 <= ev.coordinator < cfg.coordinators
        if ev.kind is FaultKind.PAUSE_PRIMARY:
            assert ev.duration > cfg.lease_ttl  # past the lease
        if ev.kind in (FaultKind.NET_CLIENT, FaultKind.NET_PEER):
            assert ev.params["mode"] in NET_MODES
        else:
            assert ev.params == {}


def test_every_kind_before_any_repeats() -> None:
    events = build_schedule(ScheduleConfig(duration=300, seed=1))
    first = [ev.kind for ev in events[:len(DEFAULT_KINDS)]]
    assert sorted(first) == sorted(DEFAULT_KINDS)


def test_smoke_length_covers_several_kinds() -> None:
    for seed in range(10):
        events = build_schedule(ScheduleConfig(duration=60, seed=seed))
        assert len({ev.kind for ev in events}) >= 3


def test_kinds_can_be_restricted_and_summarized() -> None:
    events = build_schedule(ScheduleConfig(duration=200, seed=3, kinds=(FaultKind.NET_PEER,)))
    assert {ev.kind for ev in events} == {FaultKind.NET_PEER}
    summary = summarize(events)
    assert sum(summary.values()) == len(events)
    assert all(k.startswith("net-peer:") for k in summary)
    assert build_schedule(ScheduleConfig(duration=200, kinds=())) == []
    with pytest.raises(ValueError):
        build_schedule(ScheduleConfig(duration=0))
    assert events[0].to_json()["kind"] == "net-peer"


def test_default_schedule_has_three_faults_a_minute_and_control_plane_kinds() -> None:
    from chaos.schedule import CONTROL_PLANE_KINDS, faults_per_minute

    for duration in (60, 120, 300):
        for seed in range(10):
            events = build_schedule(ScheduleConfig(duration=duration, seed=seed))
            assert faults_per_minute(events, duration) >= 3.0, (duration, seed)
    events = build_schedule(ScheduleConfig(duration=300, seed=1))
    assert set(CONTROL_PLANE_KINDS) <= {ev.kind for ev in events}
    for ev in events:
        if ev.kind is FaultKind.PAUSE_ETCD:
            assert ev.duration > 5.0  # past the lease TTL
