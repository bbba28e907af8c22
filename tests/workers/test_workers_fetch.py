"""Streaming a fragment from replicas over real sockets (workers.fetch)."""

from __future__ import annotations

import os
import time

import pytest

from fragment_store import open_store, persist_fragment, read_fragment
from workers.errors import FragmentNotLocal, ReplicaUnavailable
from workers.fetch import fetch_fragment

from .fragment_server import FragmentServer, make_fragment


@pytest.fixture
def servers():
    started: list[FragmentServer] = []

    def start(**kw) -> FragmentServer:
        s = FragmentServer(**kw).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def test_fetch_streams_exact_bytes(servers) -> None:
    data = os.urandom(300_000)
    f = make_fragment("a/fetch", 1000, data)
    srv = servers()
    srv.add(f, data)
    assert b"".join(fetch_fragment([srv.endpoint], f, timeout=5)) == data
    assert srv.requests == 1


def test_fetch_fails_over_mid_stream_without_repeating_bytes(servers) -> None:
    data = os.urandom(500_000)
    f = make_fragment("a/failover", 0, data)
    dying = servers(cut_after=200_000)
    healthy = servers()
    dying.add(f, data)
    healthy.add(f, data)
    got = b"".join(fetch_fragment([dying.endpoint, healthy.endpoint], f, timeout=5))
    assert got == data
    assert dying.requests == 1 and healthy.requests == 1


def test_fetch_skips_replicas_without_the_fragment(servers) -> None:
    data = b"x" * 5000
    f = make_fragment("a/missing", 0, data)
    empty, full = servers(), servers()
    full.add(f, data)
    assert b"".join(fetch_fragment([empty.endpoint, full.endpoint], f, timeout=5)) == data
    with pytest.raises(FragmentNotLocal):
        list(fetch_fragment([empty.endpoint], f, timeout=5))


def test_fetch_unreachable_endpoint_is_retriable_error(servers) -> None:
    f = make_fragment("a/unreach", 0, b"abc")
    srv = servers()
    srv.stop()
    with pytest.raises(ReplicaUnavailable) as info:
        list(fetch_fragment([srv.endpoint], f, timeout=2))
    assert not isinstance(info.value, FragmentNotLocal)
    assert info.value.retriable


def test_fetch_read_rate_throttles(servers) -> None:
    data = os.urandom(400_000)
    f = make_fragment("a/throttle", 0, data)
    srv = servers()
    srv.add(f, data)
    t0 = time.monotonic()
    assert b"".join(fetch_fragment([srv.endpoint], f, timeout=5, read_rate=400_000)) == data
    assert time.monotonic() - t0 >= 0.8


def test_fetched_stream_persists_with_verified_sum(servers, file_store: str) -> None:
    data = os.urandom(250_000)
    f = make_fragment("a/persisted", 4096, data, codec="zstd")
    srv = servers()
    srv.add(f, data)
    store = open_store(file_store)
    out = persist_fragment(store, f, fetch_fragment([srv.endpoint], f, timeout=5))
    assert out.backing_store == file_store
    assert b"".join(read_fragment(store, out)) == data
