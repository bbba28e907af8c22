"""The auth-on cluster the authorization tests share (test_auth_matrix.py,
test_auth_tokens.py): one signing key, an admin token, four journals — team a's, team
b's, a look-alike name, and an R=1 journal reached through a non-member (proxied) — and a
probe per RPC that reports the status and whether the connection is still usable."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
from collections.abc import Iterator

from protocol import (
    AppendCommit,
    AppendRequest,
    AppendResponse,
    ApplyChange,
    ApplyRequest,
    ApplyResponse,
    Etcd,
    FetchFragmentRequest,
    FetchFragmentResponse,
    Fragment,
    Header,
    JournalSpec,
    LabelSet,
    ListBrokersRequest,
    ListBrokersResponse,
    ListFragmentsRequest,
    ListFragmentsResponse,
    ListRequest,
    ListResponse,
    ReadRequest,
    ReadResponse,
    ReplicateProposal,
    ReplicateResponse,
    Route,
    Status,
)
from protocol.auth import Capability, Keyring, Scope
from tools.services import etcd_prefix, free_port

from .cluster import Cluster, Conn, make_workdir, spec, wait_appendable

KEY, OTHER_KEY = os.urandom(32), os.urandom(32)
RING = Keyring([KEY])
MODULE_TTL = 86400
"""Tokens minted at import live a day: the suite may reach this module long after
collection (a 600 s token expired in a 21-minute run)."""
ADMIN = RING.mint(Capability(127), Scope.of(["*"]), MODULE_TTL, "admin")

IN, OUT, LOOKALIKE = "team-a/events", "team-b/events", "team-ab/events"
SOLO = "team-a/solo"  # R=1: reached through a non-member, i.e. proxied


def labelled(name: str, team: str, replication: int = 3) -> JournalSpec:
    base = spec(name, replication=replication)
    return JournalSpec(name=name, replication=replication, labels=LabelSet.of(team=team),
                       fragment=base.fragment)


def _keys_file(workdir: str, *keys: bytes) -> str:
    path = os.path.join(workdir, f"keys-{len(os.listdir(workdir))}")
    with open(path, "w") as f:
        f.write("\n".join(base64.b64encode(k).decode() for k in keys) + "\n")
    os.chmod(path, 0o600)
    return path


def start_cluster(etcd, root: str, keys: list[list[bytes]], token: str,  # noqa: ANN001
                  metrics_port: int = 0) -> Cluster:
    """One coordinator per entry of `keys` (its keyring); node-0 serves /metrics if asked."""
    c = Cluster(etcd.url, root, make_workdir(), token=token)
    for i in range(len(keys)):
        c.add(f"zone-{i % 2}", f"node-{i}")
    for i, (node, ring) in enumerate(zip(c.nodes, keys)):
        c.extra = ["--auth-keys-file", _keys_file(c.workdir, *ring)]
        if metrics_port and i == 0:
            c.extra += ["--metrics-port", str(metrics_port)]
        c.start(node)
    c.extra = []
    return c


TEAM_A = RING.mint(Capability.APPEND | Capability.READ | Capability.LIST, Scope.of(["team-a/"]),
                   MODULE_TTL, "team-a-app")


@contextlib.contextmanager
def authed_cluster(etcd, name: str) -> Iterator[Cluster]:  # noqa: ANN001
    """Three coordinators with auth on (one keyring), node-0 serving /metrics, and the
    four journals the tests probe; a module fixture wraps it."""
    with etcd_prefix(etcd, name) as root:
        c = start_cluster(etcd, root, [[KEY]] * 3, ADMIN, metrics_port=free_port())
        c.metrics_port = int(c.nodes[0].proc.args[-1])  # type: ignore[attr-defined, union-attr]
        try:
            async def setup() -> None:
                for n in c.nodes:
                    await c.wait_listening(n)
                conn = await Conn.open(c.nodes[0].endpoint, ADMIN)
                resp = await conn.apply(labelled(IN, "a"), labelled(OUT, "b"),
                                        labelled(LOOKALIKE, "b"), labelled(SOLO, "a", 1))
                assert resp.status == Status.OK, resp
                await conn.close()
                for j in (IN, OUT, LOOKALIKE, SOLO):
                    r = await wait_appendable(c.nodes[0].endpoint, j, token=ADMIN)
                    assert r.status == Status.OK, (j, r)

            asyncio.run(setup())
            yield c
        finally:
            c.stop_all()
            if not os.environ.get("QUIRE_KEEP_WORKDIR"):
                shutil.rmtree(c.workdir, ignore_errors=True)



# -- one probe per RPC: (status, connection still usable) -------------------------------

async def probe(conn: Conn, rpc: str, journal: str, current: JournalSpec) -> tuple[Status, bool]:
    s = conn.s
    if rpc == "AppendRequest":
        s.write(AppendRequest(journal=journal))
        await s.send(AppendCommit())  # a zero-byte append: a barrier, no content
        m, _ = await s.read_message(AppendResponse)
        return m.status, m.status == Status.OK
    if rpc == "ReadRequest":
        await s.send(ReadRequest(journal=journal, offset=0, metadata_only=True))
        m, _ = await s.read_message(ReadResponse)
        return m.status, True
    if rpc == "ListFragmentsRequest":
        await s.send(ListFragmentsRequest(journal=journal))
        m, _ = await s.read_message(ListFragmentsResponse)
        return m.status, True
    if rpc == "FetchFragmentRequest":
        await s.send(FetchFragmentRequest(fragment=Fragment(journal=journal, begin=1 << 40,
                                                            end=(1 << 40) + 1)))
        m, _ = await s.read_message(FetchFragmentResponse)
        return m.status, True
    if rpc == "ReplicateProposal":
        # A route nobody holds: an admitted stream is answered WRONG_ROUTE and closed
        # before it could touch a spool.
        await s.send(ReplicateProposal(proposal=Fragment(journal=journal), header=Header(
            route=Route(), etcd=Etcd(revision=1))))
        m, _ = await s.read_message(ReplicateResponse)
        return m.status, False
    if rpc == "ListRequest":
        await s.send(ListRequest())
        m, _ = await s.read_message(ListResponse)
        listed = {e.spec.name for e in m.journals}
        # Encode "is the probed journal listed" into the status for the oracle.
        return (m.status if m.status != Status.OK else
                Status.OK if journal in listed else Status.JOURNAL_NOT_FOUND), True
    if rpc == "ListBrokersRequest":
        await s.send(ListBrokersRequest())
        m, _ = await s.read_message(ListBrokersResponse)
        return m.status, True
    if rpc == "ApplyRequest":
        # Re-put the journal's own spec at a stale revision: an admitted change fails the
        # etcd compare and writes nothing.
        await s.send(ApplyRequest(changes=(ApplyChange(upsert=current, expect_mod_revision=1),)))
        m, _ = await s.read_message(ApplyResponse)
        return m.status, True
    raise AssertionError(rpc)
