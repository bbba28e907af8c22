"""Pure parts of the runner: outcome classification and route rewriting."""

from __future__ import annotations

from chaos.writers import ProxiedRoutes as _ProxiedRoutes, classify
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
    routes = _ProxiedRoutes(["127.0.0.1:9001"], {"127.0.0.1:7001": "127.0.0.1:9001",
                                                  "127.0.0.1:7002": "127.0.0.1:9002"})
    route = Route(members=(ProcessId("zone-a", "coord0"), ProcessId("zone-b", "coord1")),
                  primary=1, endpoints=("127.0.0.1:7001", "127.0.0.1:7002"))
    routes.update("a/b", Header(route=route))
    assert routes.for_append("a/b") == "127.0.0.1:9002"
    got = routes.get("a/b")
    assert got is not None and got.endpoints == ("127.0.0.1:9001", "127.0.0.1:9002")
    routes.update("c/d", None)  # nothing to learn
    assert routes.get("c/d") is None


async def test_tracing_client_forwards_every_argument_of_the_clients_append_once(monkeypatch) -> None:  # noqa: ANN001
    """The override must follow quire.client.Client._append_once whatever its signature
    (it once took three arguments when the client passed four, and every chaos append
    failed with a TypeError)."""
    import inspect
    from types import SimpleNamespace

    from chaos.writers import TracingClient, _attempts
    from protocol import Status
    from quire.client import Client

    real = inspect.signature(Client._append_once)
    call = {name: f"<{name}>" for name in list(real.parameters)[1:]}  # all but self
    seen: list[dict] = []

    async def fake(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(real.bind(self, *args, **kwargs).arguments)
        return SimpleNamespace(status=Status.OK)

    monkeypatch.setattr(Client, "_append_once", fake)
    attempts: list[str] = []
    _attempts.set(attempts)
    tracing = object.__new__(TracingClient)
    params = list(real.parameters.values())[1:]
    positional = [call[p.name] for p in params if p.kind is not p.KEYWORD_ONLY]
    keywords = {p.name: call[p.name] for p in params if p.kind is p.KEYWORD_ONLY}
    await TracingClient._append_once(tracing, *positional, **keywords)
    assert {k: v for k, v in seen[0].items() if k != "self"} == call
    assert attempts == ["<endpoint>: OK"]
