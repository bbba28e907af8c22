"""Authorization on a real 3-coordinator cluster with auth on (issue #19).

The matrix: every RPC × every capability set (the 63 non-empty subsets) × scope kinds
(prefix, selector) × {in scope, out of scope, look-alike} → allowed or refused exactly as
docs/security.md's RPC table says (the table is read from the docs, not restated here):
3,024 cases. One cluster serves the whole module and the cases reuse connections per
token, so they cost a few seconds.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

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
    ProtocolError,
    ReadRequest,
    ReadResponse,
    ReplicateProposal,
    ReplicateResponse,
    Route,
    Status,
)
from protocol.auth import Capability, Keyring, Scope
from tools.services import etcd_prefix, free_port

from ..protocol.test_auth import docs_rpc_table
from .cluster import Cluster, Conn, make_workdir, spec, wait_appendable

pytestmark = pytest.mark.timeout(180)

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


@pytest.fixture(scope="module")
def authed(etcd) -> Iterator[Cluster]:  # noqa: ANN001
    with etcd_prefix(etcd, "auth-matrix") as root:
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


# -- one probe per RPC: (status, connection still usable, journal listed) -------------------

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


# -- traffic with auth on --------------------------------------------------------------

TEAM_A = RING.mint(Capability.APPEND | Capability.READ | Capability.LIST, Scope.of(["team-a/"]),
                   MODULE_TTL, "team-a-app")


async def _read_all(client, journal: str, end: int) -> bytes:  # noqa: ANN001
    out = bytearray()
    async for _, data in client.read(journal, 0, end_offset=end, block=True):
        out += data
    return bytes(out)


async def test_replicated_and_proxied_traffic_with_a_client_token(authed: Cluster) -> None:
    from quire.client import Client

    # Replicated (R=3): the primary's pipeline presents derived REPLICATE tokens.
    async with Client([authed.nodes[1].endpoint], token=TEAM_A, retry_timeout=20) as client:
        res = await client.append(IN, b"replicated with auth on\n")
        assert res.commit.end > res.commit.begin
        for n in authed.nodes:  # every replica serves it
            async with Client([n.endpoint], token=TEAM_A) as reader:
                got = await _read_all(reader, IN, res.commit.end)
                assert got.endswith(b"replicated with auth on\n")
        assert [e.spec.name for e in await client.list_journals()] == [IN, SOLO]
    # Proxied (R=1): through a coordinator that is not the journal's member.
    conn = await Conn.open(authed.nodes[0].endpoint, TEAM_A)
    route = next(e.route for e in (await conn.list()).journals if e.spec.name == SOLO)
    await conn.close()
    outsider = next(n for n in authed.nodes if n.endpoint not in route.endpoints)
    c = await Conn.open(outsider.endpoint, TEAM_A)
    resp = await c.append(SOLO, [b"proxied with auth on\n"])
    await c.close()
    assert resp.status == Status.OK, resp
    c = await Conn.open(outsider.endpoint, TEAM_A)
    data, metas = await c.read(SOLO, 0, end_offset=resp.commit.end)
    await c.close()
    assert data.endswith(b"proxied with auth on\n"), metas


async def test_a_client_token_is_not_a_replicate_token(authed: Cluster) -> None:
    """A client's token replayed on a replicate stream is refused (it lacks REPLICATE)."""
    conn = await Conn.open(authed.nodes[0].endpoint, TEAM_A)
    status, _ = await probe(conn, "ReplicateProposal", IN, labelled(IN, "a"))
    await conn.close()
    assert status == Status.FORBIDDEN


async def test_a_spec_moved_out_of_scope_is_refused(authed: Cluster) -> None:
    editor_a = RING.mint(Capability.APPLY | Capability.LIST, Scope.of((), "team=a"), 600, "editor-a")
    editor_b = RING.mint(Capability.APPLY, Scope.of((), "team=b"), 600, "editor-b")
    prefix_a = RING.mint(Capability.APPLY, Scope.of(["team-a/"]), 600, "prefix-a")

    async def apply(token: str, *changes: ApplyChange) -> ApplyResponse:
        conn = await Conn.open(authed.nodes[2].endpoint, token)
        try:
            await conn.s.send(ApplyRequest(changes=changes))
            return (await conn.s.read_message(ApplyResponse))[0]
        finally:
            await conn.close()

    moved = labelled(IN, "b")
    r = await apply(editor_a, ApplyChange(upsert=moved, expect_mod_revision=-1))
    assert r.status == Status.FORBIDDEN and IN in r.message and "APPLY" in r.message
    r = await apply(editor_b, ApplyChange(upsert=moved, expect_mod_revision=-1))
    assert r.status == Status.FORBIDDEN, r  # the new spec is b's, but the current one is a's
    r = await apply(prefix_a, ApplyChange(upsert=labelled("team-b/new1", "a"), expect_mod_revision=0))
    assert r.status == Status.FORBIDDEN, r
    r = await apply(prefix_a, ApplyChange(delete=OUT, expect_mod_revision=-1))
    assert r.status == Status.FORBIDDEN, r
    # One refused change refuses the whole transaction.
    r = await apply(editor_a, ApplyChange(upsert=labelled("team-a/new2", "a"), expect_mod_revision=0),
                    ApplyChange(upsert=moved, expect_mod_revision=-1))
    assert r.status == Status.FORBIDDEN, r
    conn = await Conn.open(authed.nodes[0].endpoint, ADMIN)
    listing = {e.spec.name: e.spec for e in (await conn.list()).journals}
    await conn.close()
    assert "team-a/new2" not in listing and "team-b/new1" not in listing
    assert listing[IN].labels == LabelSet.of(team="a") and OUT in listing
    # Within its scope the editor may change it (labels still team=a).
    kept = JournalSpec(name=IN, replication=3, labels=LabelSet.of(team="a", tier="hot"),
                       fragment=listing[IN].fragment)
    r = await apply(editor_a, ApplyChange(upsert=kept, expect_mod_revision=-1))
    assert r.status == Status.OK, r


def _bad_tokens() -> dict[str, str]:
    import time

    now = int(time.time())
    expired = RING.mint(Capability.READ, Scope.of(["*"]), 60, "old", now=now - 3600)
    wrong_key = Keyring([OTHER_KEY]).mint(Capability(127), Scope.of(["*"]), 600, "mallory")
    none = (base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode() + "."
            + ADMIN.split(".")[1] + ".")
    return {"missing": "", "expired": expired, "wrong key": wrong_key, "alg none": none,
            "1 MB": "a" * 1_000_000, "malformed": "hello.world.!", "truncated": ADMIN[:-5]}


async def test_bad_tokens_are_refused_without_a_crash(authed: Cluster) -> None:
    from protocol.errors import Unauthorized
    from protocol.messages import ErrorFrame, Hello
    from protocol.stream import FrameStream
    from quire.client import Client

    for name, token in _bad_tokens().items():
        for node in authed.nodes:
            s = await FrameStream.connect(node.endpoint, timeout=5.0)
            await s.send(Hello(token=token))
            frame = await asyncio.wait_for(s.read(), 10)
            assert isinstance(frame.message, ErrorFrame), name
            assert frame.message.status == Status.UNAUTHORIZED, (name, frame.message)
            await s.close()
        async with Client([authed.nodes[0].endpoint], token=token, retry_timeout=1) as client:
            with pytest.raises(Unauthorized):
                await client.list_journals()
    # A 2 MB Hello breaks the frame limit: refused as a protocol error, never buffered.
    s = await FrameStream.connect(authed.nodes[0].endpoint, timeout=5.0)
    with pytest.raises((ProtocolError, OSError)):
        await s.send(Hello(token="a" * (2 << 20)))
        await asyncio.wait_for(s.read_message(Hello), 10)
    s.abort()
    # Every coordinator is alive and serving good tokens; no token ever reached a log.
    for node in authed.nodes:
        assert node.proc is not None and node.proc.poll() is None, authed.tail(node)
        conn = await Conn.open(node.endpoint, TEAM_A)
        assert (await conn.list()).status == Status.OK
        await conn.close()
        with open(node.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert "connection refused: bad token" in log
        for token in (ADMIN, TEAM_A, _bad_tokens()["wrong key"]):
            assert token.split(".")[2] not in log  # no signature, so no token


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


def test_a_peer_with_the_wrong_key_fails_closed(etcd) -> None:  # noqa: ANN001
    """node-1 does not hold the signing key: whichever of the two is primary, the hop
    between them (a replicate pipeline, or a proxied append) is refused, so an append
    through node-0 never commits — auth is never skipped on a peer hop."""
    with etcd_prefix(etcd, "auth-wrong-peer-key") as root:
        c = start_cluster(etcd, root, [[KEY], [OTHER_KEY]], "")
        try:
            async def run() -> list[Status]:
                c.token = ADMIN
                await c.wait_listening(c.nodes[0])
                c.token = Keyring([OTHER_KEY]).mint(Capability.LIST, Scope.of(["*"]), 600, "x")
                await c.wait_listening(c.nodes[1])
                conn = await Conn.open(c.nodes[0].endpoint, ADMIN)
                assert (await conn.apply(labelled("team-a/pair", "a", 2))).status == Status.OK
                statuses = []
                for _ in range(40):  # until the 2-member route is formed and tried
                    listing = (await conn.list()).journals
                    if listing and len(listing[0].route.members) == 2:
                        break
                    await asyncio.sleep(0.1)  # the allocator assigns both members
                for _ in range(3):
                    a = await Conn.open(c.nodes[0].endpoint, TEAM_A)
                    try:
                        statuses.append((await a.append("team-a/pair", [b"x\n"])).status)
                    except ProtocolError:
                        statuses.append(Status.UNAVAILABLE)
                    await a.close()
                await conn.close()
                return statuses

            statuses = asyncio.run(run())
            assert Status.OK not in statuses and Status.UNAVAILABLE in statuses, statuses
            assert "connection refused: bad token" in c.tail(c.nodes[1], 400) + c.tail(c.nodes[0], 400)
            for n in c.nodes:
                assert n.proc is not None and n.proc.poll() is None, c.tail(n)
        finally:
            c.stop_all()
            shutil.rmtree(c.workdir, ignore_errors=True)


async def test_a_blocking_read_ends_with_its_token(authed: Cluster) -> None:
    """The read is cut when the token expires (plus the 5 s leeway); the same token then
    opens nothing."""
    import time

    from protocol.messages import ErrorFrame, Hello
    from protocol.stream import FrameStream

    now = time.time()
    short = RING.mint(Capability.READ, Scope.of(["team-a/"]), 3600, "short", now=now - 3598)
    conn = await Conn.open(authed.nodes[1].endpoint, short)
    await conn.s.send(ReadRequest(journal=IN, offset=-1, block=True))
    started = time.monotonic()
    with pytest.raises(ProtocolError):  # blocks until the cut, then the connection closes
        while True:
            await asyncio.wait_for(conn.s.read(), 30)
    assert time.monotonic() - started > 1
    await conn.close()
    s = await FrameStream.connect(authed.nodes[1].endpoint)
    await s.send(Hello(token=short))
    frame = await asyncio.wait_for(s.read(), 10)
    assert isinstance(frame.message, ErrorFrame) and frame.message.status == Status.UNAUTHORIZED
    await s.close()


def test_the_cli_with_a_team_token(authed: Cluster) -> None:
    """docs/security.md's check step: team a sees only its journals and is refused
    team b's with exit code 5 and a message naming the capability and the journal."""
    import subprocess
    import sys

    env = {**os.environ, "QUIRE_TOKEN": TEAM_A, "QUIRE_BROKER": authed.nodes[0].endpoint}

    def quire(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], input=stdin,
                              capture_output=True, timeout=60, env=env)

    out = quire("journals", "list", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert b"team-a/events" in out.stdout and b"team-b/" not in out.stdout
    out = quire("append", "-j", OUT, stdin=b"nope\n")
    assert out.returncode == 5, out.stderr
    assert b"FORBIDDEN" in out.stderr and b"APPEND" in out.stderr and OUT.encode() in out.stderr
    out = quire("--token", "junk", "journals", "list")
    assert out.returncode == 5 and b"UNAUTHORIZED" in out.stderr, out.stderr


async def test_a_token_file_rotates_without_a_restart(authed: Cluster, tmp_path) -> None:  # noqa: ANN001
    """QUIRE_TOKEN_FILE: each new connection presents the file's current token."""
    from protocol.credentials import TokenFile
    from protocol.errors import Unauthorized
    from quire.client import Client

    path = tmp_path / "token"
    now = time.time()
    short = RING.mint(Capability.LIST, Scope.of(["team-a/"]), 3600, "short", now=now - 3598)
    path.write_text(short + "\n")  # expires in ~2 s
    async with Client([authed.nodes[0].endpoint], token=TokenFile(str(path)), retry_timeout=2) as c:
        assert [e.spec.name for e in await c.list_journals()] == [IN, SOLO]
        path.write_text(TEAM_A + "\n")
        os.utime(path, (time.time() + 5, time.time() + 5))
        await asyncio.sleep(max(0.0, now + 2 - time.time()))  # the pooled connection's token expired
        # The pool retires the connection opened with the expired token and presents the
        # file's new one (the coordinator would still accept `short` for its 5 s leeway,
        # but the client does not lean on that).
        assert [e.spec.name for e in await c.list_journals()] == [IN, SOLO]
        idle = c.pool._idle[authed.nodes[0].endpoint]
        assert [conn.expires for conn in idle] == [RING.verify(TEAM_A).expires_at]
        path.write_text(_bad_tokens()["wrong key"] + "\n")
        os.utime(path, (time.time() + 10, time.time() + 10))
        c.pool.drop(authed.nodes[0].endpoint)  # the next RPC opens a new connection
        with pytest.raises(Unauthorized):
            await c.list_journals()
