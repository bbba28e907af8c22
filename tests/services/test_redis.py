"""redis-server: reachable, isolated per test, restartable."""

from __future__ import annotations

from tools.services import RedisDb, RedisService


def test_ping_set_get(redis_db: RedisDb) -> None:
    r = redis_db.client
    assert r.ping()
    r.set(redis_db.prefix + "k", b"v")
    assert r.get(redis_db.prefix + "k") == b"v"
    assert redis_db.url.endswith(f"/{redis_db.db}")


def test_databases_are_isolated(redis_db: RedisDb, redis_server: RedisService) -> None:
    redis_db.client.set("shared-name", b"mine")
    other = 0 if redis_db.db != 0 else 1
    with redis_server.client(other) as r:
        assert r.get("shared-name") is None


def test_restart_on_same_port_forgets_data() -> None:
    # Started without persistence on purpose: Redis is a cache and a queue here.
    with RedisService("redis-restart") as svc:
        port = svc.port
        with svc.client() as r:
            r.set("k", b"v")
        svc.restart()
        assert svc.port == port
        with svc.client() as r:
            assert r.ping() and r.get("k") is None
