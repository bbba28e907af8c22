"""The pulse sweep fans out one pulse per journal (suspended journals are skipped).

Pulses against a real coordinator are in test_workers_e2e.py (a pulse rolls a spool).
"""

from __future__ import annotations

import json

import msgspec

from protocol import JournalSpec, Suspend, SuspendLevel
from tools.services import wait_for

from .workers_support import put_journal, put_keys


def test_pulse_sweep_fans_out_per_journal(start_worker, client, etcd, etcd_root) -> None:
    put_journal(etcd, etcd_root, "acme/pulse-a")
    put_journal(etcd, etcd_root, "acme/pulse-b")
    suspended = JournalSpec(name="acme/pulse-c", replication=1,
                            suspend=Suspend(level=SuspendLevel.FULL))
    put_keys(etcd, {f"{etcd_root}/journals/acme/pulse-c": msgspec.json.encode(suspended)})
    worker = start_worker(queues=("pulse",))
    client.send_task("workers.pulse.sweep", queue="pulse")

    def swept():
        for line in worker.log_text().splitlines():
            if '"pulse sweep"' in line:
                return json.loads(line)
        return None

    assert wait_for(swept, timeout=30, what="the sweep")["journals"] == 2
    # Each fanned-out pulse ran (and, with no coordinator assigned, was retried).
    wait_for(lambda: worker.log_text().count("workers.pulse.pulse_journal") >= 2, timeout=30,
             what="per-journal pulse tasks")


def test_plan_groups_journals_by_their_primary() -> None:
    from workers.pulse import plan
    from workers.topology import JournalTopology, Topology

    def jt(name: str, *endpoints: str, level: SuspendLevel = SuspendLevel.NONE) -> JournalTopology:
        return JournalTopology(spec=JournalSpec(name=name, replication=max(1, len(endpoints)),
                                                suspend=Suspend(level=level)), endpoints=endpoints)

    topo = Topology(journals={j.spec.name: j for j in (
        jt("a/1", "h:1", "h:2"), jt("a/2", "h:2", "h:1"), jt("a/3", "h:1"), jt("a/4"),
        jt("a/5", "h:1", level=SuspendLevel.FULL))})
    assert plan(topo) == ({"h:1": ["a/1", "a/3"], "h:2": ["a/2"]}, ["a/4"])


async def test_pulse_sweep_pulses_a_members_journals_in_one_task(
        start_worker, client, env, etcd, etcd_root, redis_db, tmp_path) -> None:
    """Six journals led by one coordinator: one `pulse_member` task pulses them all over
    one client and records each one's mark (no etcd read or connection per journal)."""
    from quire.client.client import Client
    from tools.services import free_port
    from workers.watermark import MARKS_PREFIX

    from tests.coordinator.cluster import until

    from .workers_support import appendable, coordinator

    port = free_port()
    coord = coordinator("coord-p", etcd=etcd, root=etcd_root, redis_url=None,
                        spool_dir=str(tmp_path / "spool"), port=port)
    coord.start()
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
    names = [f"acme/batch-{i}" for i in range(6)]
    try:
        await qc.apply([JournalSpec(name=n, replication=1) for n in names])
        for n in names:
            await until(lambda n=n: appendable(qc, n), 30, f"{n} to accept appends")
        worker = start_worker(queues=("pulse",))
        client.send_task("workers.pulse.sweep", queue="pulse")

        def pulsed():
            for line in worker.log_text().splitlines():
                if '"pulsed a member\'s journals"' in line:
                    return json.loads(line)
            return None

        out = await until(pulsed, 60, "the member's pulse task")
        assert (out["journals"], out["ok"], out["failed"]) == (6, 6, 0), out
        text = worker.log_text()
        assert text.count("workers.pulse.pulse_member[") >= 1
        assert "workers.pulse.pulse_journal[" not in text  # no task per journal
        for n in names:
            assert redis_db.client.zcard(MARKS_PREFIX + n) >= 1, n
    finally:
        await qc.close()
        coord.stop()
