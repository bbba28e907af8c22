"""The small-append path's one route lookup (RouteCache.append_target) answers as the
three lookups it replaces (for_append, primary, revision)."""

from __future__ import annotations

import time

from protocol import Etcd, Header, ProcessId, Route
from quire.client.routes import RouteCache


def _cache(ttl: float = 100.0) -> RouteCache:
    routes = RouteCache(["127.0.0.1:1"], ttl=ttl)
    route = Route(members=(ProcessId(zone="z", suffix="p"),), primary=0, endpoints=("127.0.0.1:2",))
    routes.update("a/b", Header(route=route, etcd=Etcd(revision=7)))
    return routes


def test_append_target_is_the_three_lookups_in_one() -> None:
    routes = _cache()
    now = time.monotonic()
    want = (routes.for_append("a/b"), routes.primary("a/b"), routes.revision("a/b"))
    assert routes.append_target("a/b", now) == want == ("127.0.0.1:2", "127.0.0.1:2", 7)
    # Nothing cached: a seed, no primary, no revision (as the three say).
    assert routes.append_target("c/d", now) == ("127.0.0.1:1", None, 0)


def test_append_target_ages_as_the_cache_does() -> None:
    routes = _cache(ttl=100.0)
    at = routes._routes["a/b"][1]  # noqa: SLF001
    # Past half the TTL: still the primary, but no revision (the answer renews it).
    assert routes.append_target("a/b", at + 60.0) == ("127.0.0.1:2", "127.0.0.1:2", 0)
    assert routes.append_target("a/b", at + 49.0)[2] == 7


def test_append_target_skips_a_primary_marked_down() -> None:
    routes = _cache()
    routes.mark_down("127.0.0.1:2")  # (drops the routes naming it)
    assert routes.append_target("a/b", time.monotonic()) == (
        routes.for_append("a/b"), routes.primary("a/b"), routes.revision("a/b"))
    assert routes.append_target("a/b", time.monotonic())[0] == "127.0.0.1:1"
