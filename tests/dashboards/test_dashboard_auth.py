"""The dashboard with auth on: /api/state needs a LIST token (bearer or /login session
cookie) and shows only the journals in its scope; the page itself stays open."""

from __future__ import annotations

import json
import os

import pytest

from dashboards.access import visible_state
from dashboards.server import DashboardServer
from dashboards.state import StateCollector
from protocol.auth import Capability, Keyring, Scope
from tools.services import free_port

from .test_server import exchange

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="session")]

RING = Keyring([os.urandom(32)])
MODULE_TTL = 86400
"""Tokens minted at import live a day: the suite may reach this module long after
collection (a 600 s token expired in a 21-minute run)."""
VIEWER = RING.mint(Capability.LIST | Capability.READ, Scope.of(["team-a/"]), MODULE_TTL, "viewer")
NO_LIST = RING.mint(Capability.READ, Scope.of(["*"]), MODULE_TTL, "reader")


@pytest.fixture
async def server():  # type: ignore[no-untyped-def]
    dead_etcd = f"http://127.0.0.1:{free_port()}"
    srv = DashboardServer(StateCollector(dead_etcd, "/quire-none", timeout=0.5), "127.0.0.1", 0,
                          keyring=RING)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *headers]) + "\r\n\r\n").encode()


async def test_state_needs_a_list_token(server: DashboardServer) -> None:
    assert (await exchange(server.port, get("/")))[0] == 200  # the page has no data
    assert (await exchange(server.port, get("/healthz")))[0] == 200
    assert (await exchange(server.port, get("/api/state")))[0] == 401
    assert (await exchange(server.port, get("/api/state", "Authorization: Bearer junk")))[0] == 401
    wrong = Keyring([os.urandom(32)]).mint(Capability.LIST, Scope.of(["*"]), 60, "x")
    assert (await exchange(server.port, get("/api/state", f"Authorization: Bearer {wrong}")))[0] == 401
    assert (await exchange(server.port, get("/api/state", f"Authorization: Bearer {NO_LIST}")))[0] == 403
    status, _, body = await exchange(server.port, get("/api/state", f"Authorization: Bearer {VIEWER}"))
    assert status == 200 and "journals" in json.loads(body)


async def test_login_sets_a_session_cookie(server: DashboardServer) -> None:
    assert (await exchange(server.port, get("/login?token=junk")))[0] == 401
    status, headers, _ = await exchange(server.port, get(f"/login?token={VIEWER}"))
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    pair = cookie.split(";")[0]
    status, _, _ = await exchange(server.port, get("/api/state", f"Cookie: theme=dark; {pair}"))
    assert status == 200


async def test_state_is_filtered_by_scope() -> None:
    claims = RING.verify(VIEWER)
    state = {"journals": [{"name": "team-a/x1", "labels": {}}, {"name": "team-b/x1", "labels": {}},
                          {"name": "team-ab/x1", "labels": {"team": ["a"]}}], "brokers": [1]}
    out = visible_state(state, claims)
    assert [j["name"] for j in out["journals"]] == ["team-a/x1"] and out["brokers"] == [1]
    sel = RING.verify(RING.mint(Capability.LIST, Scope.of((), "team=a"), 60, "s"))
    assert [j["name"] for j in visible_state(state, sel)["journals"]] == ["team-ab/x1"]
