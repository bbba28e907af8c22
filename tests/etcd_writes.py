"""Writes a test may retry safely after a timeout.

A write whose answer was lost (the client's timeout, a cut link, a member that lost
its leader after forwarding the proposal) may still have been committed. Retried
blindly, it is committed twice: two events for one key at two revisions, which a
correct watch then delivers both of (tests/topology/test_watch_redelivery.py). A test
that counts events therefore writes each key once, guarded by its create revision,
as quire's own writes are guarded by revisions."""

from __future__ import annotations

import asyncio
import time

import aetcd

from topology.etcd import cmp_create, put_op, txn


async def create_once(client: aetcd.Client, key: bytes, value: bytes, *, within: float = 20.0,
                      attempt: float = 3.0) -> int:
    """Create `key` if absent, retrying while the cluster elects; return the revision of
    the write that created it (a retry that finds it created reads that revision)."""
    deadline = time.monotonic() + within
    while True:
        try:
            res = await asyncio.wait_for(txn(client, [cmp_create(key, 0)], [put_op(key, value)]),
                                         attempt)
            if res.succeeded:
                return res.revision
            got = await asyncio.wait_for(client.get(key), attempt)
            return int(got.mod_revision)
        except Exception:  # noqa: BLE001 - request timed out / no leader / our member cut
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
