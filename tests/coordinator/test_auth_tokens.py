"""Tokens on a real 3-coordinator cluster with auth on (issue #19): replicated and
proxied traffic under a client token, a client token refused as a replicate token, a
spec moved out of scope, bad tokens refused without a crash, a peer holding the wrong key
failing closed, a blocking read cut at its token's expiry, the CLI with a team token, and
a token file rotating without a restart. The authorization matrix: test_auth_matrix.py.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import time
from collections.abc import Iterator

import pytest

from protocol import (
    ApplyChange,
    ApplyRequest,
    ApplyResponse,
    JournalSpec,
    LabelSet,
    ProtocolError,
    ReadRequest,
    Status,
)
from protocol.auth import Capability, Keyring, Scope
from tools.services import etcd_prefix

from .auth_cluster import (
    ADMIN,
    IN,
    KEY,
    OTHER_KEY,
    OUT,
    RING,
    SOLO,
    TEAM_A,
    authed_cluster,
    labelled,
    probe,
    start_cluster,
)
from .cluster import Cluster, Conn

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def authed(etcd) -> Iterator[Cluster]:  # noqa: ANN001
    with authed_cluster(etcd, "auth-tokens") as c:
        yield c


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
