"""The coordinator's auth gate, without sockets: admission, one log line per connection,
refusal answers, and the derived peer tokens."""

from __future__ import annotations

import os

import pytest
from structlog.testing import capture_logs

from coordinator.auth_gate import ConnAuth, Gate, PeerTokens, refusal_response
from protocol import (
    AppendRequest,
    AppendResponse,
    ListRequest,
    ReadRequest,
    ReadResponse,
    Status,
)
from protocol.auth import PEER_READ_TTL, PEER_TTL, Capability, Keyring, Scope, TokenError

RING = Keyring([os.urandom(32)])


def test_gate_off_admits_everyone_and_on_verifies() -> None:
    assert not Gate(None).admit("", "p").on
    with pytest.raises(TokenError):
        Gate(RING).admit("junk", "p")
    tok = RING.mint(Capability.READ, Scope.of(["team-a/"]), 60, "alice")
    auth = Gate(RING).admit(tok, "p")
    assert auth.on and auth.subject == "alice" and 0 < auth.remaining() <= 65  # type: ignore[operator]


def test_refusals_are_logged_once_per_connection_never_with_the_token() -> None:
    tok = RING.mint(Capability.READ, Scope.of(["team-a/"]), 60, "alice")
    auth = Gate(RING).admit(tok, "127.0.0.2:5")
    with capture_logs() as logs:
        for j in ("team-b/x1", "team-b/x2", "team-c/x3"):
            assert auth.check(ReadRequest(journal=j), lambda _: None) is not None
        assert auth.check(ReadRequest(journal="team-a/x1"), lambda _: None) is None
    refused = [e for e in logs if e["event"] == "request refused"]
    assert len(refused) == 1 and refused[0]["subject"] == "alice"
    assert refused[0]["journal"] == "team-b/x1" and refused[0]["capability"] == "READ"
    assert tok not in repr(logs)


def test_refusal_answers_and_whether_the_connection_survives() -> None:
    auth = ConnAuth(RING.verify(RING.mint(Capability.LIST, Scope.of(["*"]), 60, "x")), "p")
    r = auth.check(AppendRequest(journal="team-a/x1"), lambda _: None)
    assert r is not None
    answer, keep = refusal_response(AppendRequest(journal="team-a/x1"), r)
    assert isinstance(answer, AppendResponse) and answer.status == Status.FORBIDDEN and not keep
    answer, keep = refusal_response(ReadRequest(journal="team-a/x1"), r)
    assert isinstance(answer, ReadResponse) and keep
    assert auth.check(ListRequest(), lambda _: None) is None


def test_peer_tokens_are_derived_per_journal_and_capability_and_cached() -> None:
    assert PeerTokens(None, "peer:z#a").token(Capability.REPLICATE, "team-a/x1") == ""
    peers = PeerTokens(RING, "peer:z#a")
    t1 = peers.token(Capability.REPLICATE, "team-a/x1")
    assert peers.token(Capability.REPLICATE, "team-a/x1") == t1  # cached
    c = RING.verify(t1)
    assert c.subject == "peer:z#a" and c.caps == Capability.REPLICATE
    assert c.scope.prefixes == ("team-a/x1",) and not c.scope.covers("team-a/x2", None)
    # A replication pipeline is cut when its token expires: it lives as long as a read's.
    assert c.expires_at - c.issued_at == PEER_READ_TTL
    a = RING.verify(peers.token(Capability.APPEND, "team-a/x1"))
    assert a.expires_at - a.issued_at == PEER_TTL
    r = RING.verify(peers.token(Capability.READ, "team-a/x1"))
    assert r.expires_at - r.issued_at == PEER_READ_TTL and r.caps == Capability.READ
