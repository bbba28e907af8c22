"""Workers against a coordinator with auth on: persistence fetches and pulses present
QUIRE_TOKEN (a read,append token), so closed fragments still reach the store."""

from __future__ import annotations

import base64
import os

import pytest

from fragment_store import CoverSet, fragment_key, open_store
from protocol import FragmentSpec, JournalSpec
from protocol.auth import Capability, Keyring, Scope
from quire.client.client import Client
from tools.services import free_port

from .test_workers_e2e import until
from .workers_support import coordinator

pytestmark = pytest.mark.timeout(120)

J = "acme/auth/part-000"


async def test_persist_and_pulse_with_auth_on(start_worker, client, etcd, etcd_root, redis_db,
                                              tmp_path) -> None:
    key = os.urandom(32)
    ring = Keyring([key])
    admin = ring.mint(Capability(127), Scope.of(["*"]), 600, "admin")
    worker_token = ring.mint(Capability.READ | Capability.APPEND, Scope.of(["*"]), 600, "workers")
    store_url = (tmp_path / "store").as_uri() + "/"
    port = free_port()
    coord = coordinator("coord-auth", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                        spool_dir=str(tmp_path / "spool"), port=port,
                        env={"QUIRE_AUTH_KEYS": base64.b64encode(key).decode()})
    coord.start()
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30, token=admin)
    try:
        await qc.apply([JournalSpec(name=J, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec="none", stores=(store_url,), refresh_interval=1.0))])

        async def appendable() -> bool:
            try:
                await qc.append(J, b"", retry_timeout=2)
                return True
            except Exception:  # noqa: BLE001 - the route is still forming
                return False

        await until(appendable, 30, "the journal to accept appends")
        a = os.urandom(3000)
        ra = await qc.append(J, a)
        await qc.append(J, b"x" * 1500)  # rolls [.., end of a): length 3000 > 1024
        start_worker(queues=("persist", "index", "pulse"), QUIRE_TOKEN=worker_token)
        frags = CoverSet.from_json(await until(
            lambda: redis_db.client.get(f"quire:index:{J}"), 60, "the index in Redis"))
        assert (frags[0].begin, frags[0].end) == (ra.begin, ra.end)
        assert open_store(store_url).exists(fragment_key(frags[0]))
        # A pulse (a zero-byte append by the worker, with its token) rolls the rest.
        client.send_task("workers.pulse.pulse_journal", args=[J], queue="pulse")
        await until(lambda: len(CoverSet.from_json(redis_db.client.get(f"quire:index:{J}"))) == 2,
                    60, "the pulsed fragment to be persisted")
    finally:
        await qc.close()
        coord.close()
