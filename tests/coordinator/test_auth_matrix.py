"""Authorization on a real 3-coordinator cluster with auth on (issue #19).

The matrix: every RPC × every capability set (the 63 non-empty subsets) × scope kinds
(prefix, selector) × {in scope, out of scope, look-alike} → allowed or refused exactly as
docs/security.md's RPC table says (the table is read from the docs, not restated here):
3,024 cases. One cluster serves the whole module and the cases reuse connections per
token, so they cost a few seconds; the refusals they cause are then found in the logs and
the metrics. Tokens themselves (bad, expired, rotated, a peer's wrong key) and traffic
with auth on: test_auth_tokens.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from protocol import ProtocolError, Status
from protocol.auth import Capability, Scope

from ..protocol.test_auth import docs_rpc_table
from .auth_cluster import IN, LOOKALIKE, OUT, RING, TEAM_A, authed_cluster, labelled, probe
from .cluster import Cluster, Conn

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def authed(etcd) -> Iterator[Cluster]:  # noqa: ANN001
    with authed_cluster(etcd, "auth-matrix") as c:
        yield c


ALLOWED_STATUS = {
    "AppendRequest": {Status.OK},
    "ReadRequest": {Status.OK, Status.OFFSET_NOT_YET_AVAILABLE},
    "ListFragmentsRequest": {Status.OK},
    "FetchFragmentRequest": {Status.OFFSET_NOT_YET_AVAILABLE, Status.JOURNAL_NOT_FOUND},
    "ReplicateProposal": {Status.WRONG_ROUTE},
    "ListRequest": {Status.OK},
    "ListBrokersRequest": {Status.OK},
    "ApplyRequest": {Status.ETCD_TRANSACTION_FAILED},
}
"""What an admitted probe answers (anything but FORBIDDEN, and the expected thing)."""

ALL = [c for c in Capability]
CAP_SETS = [Capability(sum(c for c, bit in zip(ALL, f"{n:06b}"[::-1]) if bit == "1"))
            for n in range(1, 1 << len(ALL))]
"""Every non-empty subset of the six capabilities: 63 sets."""
SCOPES = {"prefix": Scope.of(["team-a/"]), "selector": Scope.of((), "team=a")}
TARGETS = {"in": IN, "out": OUT, "lookalike": LOOKALIKE}


@dataclass(frozen=True)
class Case:
    rpc: str
    caps: Capability
    scope: str
    target: str

    def expected(self, table: dict[str, str]) -> set[Status]:
        """The oracle: docs table capability + scope → allowed statuses or FORBIDDEN."""
        need = Capability[table[self.rpc]]
        if not self.caps & need:
            return {Status.FORBIDDEN}
        if self.rpc == "ListBrokersRequest":  # cluster-wide: scope does not apply
            return ALLOWED_STATUS[self.rpc]
        if self.rpc == "ListRequest":  # filtered, never refused
            return {Status.OK} if self.target == "in" else {Status.JOURNAL_NOT_FOUND}
        return ALLOWED_STATUS[self.rpc] if self.target == "in" else {Status.FORBIDDEN}


def cases(table: dict[str, str]) -> list[Case]:
    return [Case(rpc, caps, scope, target) for rpc, caps, scope, target
            in itertools.product(sorted(table), CAP_SETS, SCOPES, TARGETS)]


async def test_authorization_matrix(authed: Cluster) -> None:
    table = docs_rpc_table()
    all_cases = cases(table)
    assert len(all_cases) >= 200
    specs = {j: labelled(j, "a" if j.startswith("team-a/") else "b") for j in TARGETS.values()}
    tokens = {(caps, kind): RING.mint(caps, scope, 600, f"matrix-{int(caps)}-{kind}")
              for caps in CAP_SETS for kind, scope in SCOPES.items()}
    conns: dict[tuple[str, int], Conn] = {}
    wrong: list[str] = []
    seen: set[tuple[str, bool]] = set()
    try:
        for i, case in enumerate(all_cases):
            node = authed.nodes[i % len(authed.nodes)].endpoint
            token = tokens[(case.caps, case.scope)]
            conn = conns.pop((token, i % 3), None) or await Conn.open(node, token)
            journal = TARGETS[case.target]
            try:
                status, keep = await asyncio.wait_for(probe(conn, case.rpc, journal, specs[journal]), 30)
            except ProtocolError as exc:
                status, keep = Status.BAD_REQUEST, False
                wrong.append(f"{case}: {exc}")
            seen.add((case.rpc, status == Status.FORBIDDEN))
            want = case.expected(table)
            if status not in want:
                wrong.append(f"{case.rpc} caps={case.caps!r} scope={case.scope} "
                             f"target={case.target}: got {status.name}, want {sorted(s.name for s in want)}")
            if keep and status != Status.FORBIDDEN or case.rpc in ("ReadRequest", "ListRequest",
                                                                   "ListBrokersRequest",
                                                                   "ListFragmentsRequest",
                                                                   "FetchFragmentRequest",
                                                                   "ApplyRequest"):
                conns[(token, i % 3)] = conn
            else:
                await conn.close()
    finally:
        for c in conns.values():
            await c.close()
    assert not wrong, f"{len(wrong)} of {len(all_cases)} cases differ:\n" + "\n".join(wrong[:40])
    # Every RPC was both admitted and refused somewhere in the matrix.
    assert seen == {(rpc, refused) for rpc in table for refused in (True, False)}
    print(f"{len(all_cases)} authorization cases as documented")
    for n in authed.nodes:
        assert n.proc is not None and n.proc.poll() is None, authed.tail(n)


def test_refusals_are_logged_with_the_subject(authed: Cluster) -> None:
    logs = "".join(open(n.log_path, encoding="utf-8", errors="replace").read() for n in authed.nodes)
    refused = [line for line in logs.splitlines() if "request refused" in line]
    assert refused and all('"subject"' in line for line in refused)
    assert any("matrix-" in line and '"capability"' in line for line in refused)


async def test_refusals_are_counted(authed: Cluster) -> None:
    import urllib.request

    from protocol.messages import Hello
    from protocol.stream import FrameStream

    conn = await Conn.open(authed.nodes[0].endpoint, TEAM_A)  # one forbidden append
    assert (await conn.append(OUT, [])).status == Status.FORBIDDEN
    await conn.close()
    s = await FrameStream.connect(authed.nodes[0].endpoint)  # one unauthorized hello
    await s.send(Hello(token="junk"))
    await asyncio.wait_for(s.read(), 10)
    await s.close()
    port = authed.metrics_port  # type: ignore[attr-defined]
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
    counts = {}
    for line in text.splitlines():
        if line.startswith("quire_auth_refusals_total{"):
            labels, _, value = line.rpartition(" ")
            counts[labels] = float(value)
    assert counts.get('quire_auth_refusals_total{capability="APPEND",reason="forbidden"}', 0) > 0
    assert counts.get('quire_auth_refusals_total{capability="",reason="unauthorized"}', 0) > 0


async def test_a_multiplexed_replicate_connection_needs_a_replicate_token(authed: Cluster) -> None:
    """The connection-level Hello of a primary's multiplexed replicate connection
    (protocol/mux.py) is checked like any Hello, and must carry REPLICATE; each of its
    channels then presents its own journal's token (test_replicate_mux.py)."""
    from protocol.messages import ErrorFrame, Hello, HelloAck
    from protocol.stream import FrameStream

    async def hello(token: str):  # noqa: ANN202
        s = await FrameStream.connect(authed.nodes[0].endpoint, timeout=5.0)
        try:
            await s.send(Hello(token=token, mux=True))
            async with asyncio.timeout(10):
                return (await s.read()).message
        finally:
            await s.close()

    read_only = RING.mint(Capability.READ, Scope.of(["*"]), 600, "mux-reader")
    replicate = RING.mint(Capability.REPLICATE, Scope.of([IN]), 600, "mux-peer")
    refused = await hello(read_only)
    assert isinstance(refused, ErrorFrame) and refused.status == Status.FORBIDDEN, refused
    unauthorized = await hello("not a token")
    assert isinstance(unauthorized, ErrorFrame) and unauthorized.status == Status.UNAUTHORIZED
    admitted = await hello(replicate)
    assert isinstance(admitted, HelloAck) and admitted.mux, admitted
