"""Pure parts of the runner: outcome classification and route rewriting."""

from __future__ import annotations

import pytest

from chaos.writers import _attempts, classify, proxied_routes, trace_attempt
from protocol import Header, ProcessId, Route, Status
from protocol.errors import (
    Aborted,
    CommitUnknown,
    IndexHasGreaterOffset,
    JournalNotFound,
    NotJournalPrimaryBroker,
    Unavailable,
    WrongAppendOffset,
)


def test_classify_definite_and_indefinite() -> None:
    assert classify(JournalNotFound("x")) == "fail"
    assert classify(WrongAppendOffset("x")) == "fail"
    assert classify(NotJournalPrimaryBroker("x")) == "fail"
    assert classify(Unavailable("connection refused before the commit")) == "fail"
    assert classify(Unavailable("outcome unknown: connection reset")) == "info"
    assert classify(Aborted("pipeline broke")) == "info"
    # COMMIT_UNKNOWN answered, or the connection lost after the commit was sent.
    assert classify(CommitUnknown("outcome unknown: the commit was sent, then reset")) == "info"
    assert classify(CommitUnknown("the commit was sent, then peer reset")) == "info"
    assert not Status.COMMIT_UNKNOWN.retriable
    assert classify(IndexHasGreaterOffset("x")) == "info"
    assert classify(TimeoutError()) == "info"
    assert classify(ConnectionResetError()) == "info"
    assert Status.UNAVAILABLE.retriable


def test_routes_are_rewritten_to_client_proxies() -> None:
    routes = proxied_routes(["127.0.0.1:9001"], {"127.0.0.1:7001": "127.0.0.1:9001",
                                                  "127.0.0.1:7002": "127.0.0.1:9002"})
    route = Route(members=(ProcessId("zone-a", "coord0"), ProcessId("zone-b", "coord1")),
                  primary=1, endpoints=("127.0.0.1:7001", "127.0.0.1:7002"))
    routes.update("a/b", Header(route=route))
    assert routes.for_append("a/b") == "127.0.0.1:9002"
    got = routes.get("a/b")
    assert got is not None and got.endpoints == ("127.0.0.1:9001", "127.0.0.1:9002")
    routes.update("c/d", None)  # nothing to learn
    assert routes.get("c/d") is None


async def test_every_attempt_of_a_small_append_is_traced() -> None:
    """The writers' client reports each attempt (Client.on_attempt), whichever path the
    append takes: a small append goes whole (`_append_whole`), which an override of
    `_append_once` (the tracer's old hook) no longer saw."""
    from quire.client import Client
    from tools.services import free_port

    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens: every attempt is refused
    attempts: list[str] = []
    _attempts.set(attempts)
    client = Client([endpoint], retry_timeout=1.0, connect_timeout=0.5)
    client.on_attempt = trace_attempt
    try:
        with pytest.raises(Unavailable):
            await client.append("chaos/traced", b"x" * 100)
    finally:
        await client.close()
    assert len(attempts) >= 2, attempts  # retried inside append, each attempt seen
    assert all(a.startswith(f"{endpoint}: Unavailable") for a in attempts), attempts
