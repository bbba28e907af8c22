"""The pure parts of `quire chaos --hosts`: the zones of the coordinator hosts, the
network-layer kinds in the schedule (rate, targets), recovery after a primary's host is
isolated or killed, and the CLI refusing kinds that do not fit the mode."""

from __future__ import annotations

import pytest
import typer

from chaos.history import FaultRecord, Op
from chaos.host_cluster import host_zones
from chaos.main import _host_kinds
from chaos.net_faults import NET_LAYER_KINDS, isolation_recovery
from chaos.runner import ChaosConfig
from chaos.schedule import FaultKind, ScheduleConfig, build_schedule, faults_per_minute


def test_coordinator_hosts_span_three_zones() -> None:
    assert host_zones(5) == ["zone-a", "zone-a", "zone-b", "zone-c", "zone-c"]
    assert set(host_zones(3)) == set(host_zones(4)) == {"zone-a", "zone-b", "zone-c"}
    with pytest.raises(ValueError, match="at least 3"):
        host_zones(2)


@pytest.mark.parametrize("duration", [120.0, 300.0])
def test_network_layer_schedule_has_four_faults_a_minute(duration: float) -> None:
    events = build_schedule(ScheduleConfig(duration=duration, seed=3, coordinators=5,
                                           kinds=NET_LAYER_KINDS))
    assert {e.kind for e in events} == set(NET_LAYER_KINDS)
    assert faults_per_minute(events, duration) >= 4.0
    for a, b in zip(events, events[1:]):
        assert a.ends <= b.at  # one at a time


def _op(journal: str, t0: float, t1: float, outcome: str = "ok") -> Op:
    return Op(uid=f"{journal}{t0}", writer=0, seq=0, journal=journal, size=1, t_invoke=t0,
              t_done=t1, outcome=outcome)


def test_isolation_recovery_is_fault_to_first_ok_append_invoked_after_it() -> None:
    faults = [FaultRecord("isolate-host", 10.0, journal="j1"),
              FaultRecord("isolate-host", 30.0, journal="j2"),
              FaultRecord("kill-host", 50.0, journal="j1"),
              FaultRecord("cut-etcd-quorum", 70.0)]
    ops = [_op("j1", 9.0, 16.0),           # invoked before the fault: not a recovery
           _op("j1", 11.0, 17.5, "info"),  # not ok
           _op("j1", 12.0, 16.5),          # the first ok after the fault
           _op("j2", 31.0, 33.0), _op("j1", 52.0, 58.25)]
    rec = isolation_recovery(faults, ops)
    assert rec["isolate-host"] == {"faults": 2, "recovered": 2, "p50": 4.75, "max": 6.5,
                                   "each": [6.5, 3.0]}
    assert rec["kill-host"]["each"] == [8.25]
    assert "cut-etcd-quorum" not in rec
    assert isolation_recovery([FaultRecord("isolate-host", 1.0, journal="j")], [])[
        "isolate-host"]["recovered"] == 0


def test_cli_kinds_fit_the_mode() -> None:
    cfg = ChaosConfig(kinds=(FaultKind.ISOLATE_HOST,))
    with pytest.raises(typer.BadParameter, match="need --hosts"):
        _host_kinds(cfg, 0, True)
    cfg = ChaosConfig()
    _host_kinds(cfg, 0, False)  # the proxy mode is unchanged
    assert FaultKind.ISOLATE_HOST not in cfg.kinds
