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
