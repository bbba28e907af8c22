"""A member that lost its spool in a crash (kill -9: open spools are not recovered) and
was rolled forward by a sync holds none of the committed bytes below its new spool.
Those bytes were acknowledged and its peers hold them: a read at that member must
serve them (from a peer), never skip them as if they had not been written. Only a gap
no member and no store holds (pruned, or lost by every replica) is skipped."""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from protocol import Status

from .cluster import Cluster, Conn, make_workdir, serve_journal, wait_appendable

pytestmark = pytest.mark.timeout(120)

J = "gaps/j"


async def _append_all(endpoint: str, lines: list[bytes]) -> None:
    conn = await Conn.open(endpoint)
    try:
        for line in lines:
            r = await conn.append(J, [line])
            assert r.status == Status.OK, r
    finally:
        await conn.close()


async def test_a_member_rolled_forward_after_a_crash_serves_the_bytes_below_its_spool(
        etcd, etcd_root) -> None:  # noqa: ANN001
    c = Cluster(etcd.url, etcd_root, make_workdir())
    a, b = c.add("zone-a", "node-a"), c.add("zone-b", "node-b")
    try:
        c.start(a)
        c.start(b)
        await serve_journal(c, J, replication=2)
        before = [b"before %03d\n" % i for i in range(50)]
        await _append_all(a.endpoint, before)

        c.kill(a, signal.SIGKILL)  # its open spool (every byte so far) is gone
        a.proc.wait(10)
        c.start(a)
        await c.wait_listening(a)
        # The journal takes appends again once `a` is back in the route: its first
        # commit's sync rolls `a` forward to b's end, past bytes it no longer holds.
        assert (await wait_appendable(b.endpoint, J, timeout=60)).status == Status.OK
        after = [b"after %03d\n" % i for i in range(20)]
        await _append_all(b.endpoint, after)
        want = b"".join(before + after)

        for node in (a, b):  # members serve reads themselves (no proxy hop)
            conn = await Conn.open(node.endpoint)
            try:
                got, metas = await conn.read(J, 0, end_offset=len(want))
            finally:
                await conn.close()
            assert got == want, (node.suffix, [(m.status, m.offset) for m in metas])
    finally:
        c.stop_all()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)
