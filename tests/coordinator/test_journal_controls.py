"""Per-journal controls enforced by the append path: max_append_rate and suspension."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from protocol import AppendResponse, JournalSpec, Status, Suspend, SuspendLevel
from coordinator.flow_control import MinRatePolicer, RateLimiter

from .cluster import Cluster, Conn, running, spec, wait_appendable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster3(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root, 3, ["--min-append-rate", "65536"]) as c:
        yield c


# -- max_append_rate ---------------------------------------------------------------------

def test_rate_limiter_bounds_bytes_per_window() -> None:
    """Over any window the bucket lets through at most rate x (window + 1 s burst)."""
    rate = 10_000
    lim = RateLimiter(rate, now=0.0)
    now, chunk = 0.0, 1_000
    while now < 5.0:  # a sender that always sends as soon as it is allowed
        now += lim.delay_for(chunk, now)
    assert lim.taken <= rate * (now + 1.0) + chunk
    assert lim.taken >= rate * now  # and does not throttle below the rate
    # A sender slower than the rate is never delayed.
    lim2 = RateLimiter(rate, now=0.0)
    assert all(lim2.delay_for(chunk, t * 0.2) == 0.0 for t in range(1, 50))


def test_throttling_is_not_charged_to_the_client() -> None:
    """Time the broker held an append back must not make the client 'too slow'."""
    p = MinRatePolicer(65536, now=0.0)  # 1 s of credit
    p.pause(5.0)  # the broker throttled us for 5 s
    assert not p.too_slow(5.5)
    assert p.too_slow(6.5)


async def _spec_of(conn: Conn, name: str) -> JournalSpec:
    listing = await conn.list()
    return next(e.spec for e in listing.journals if e.spec.name == name)


async def test_max_append_rate_throttles_appends(cluster3: Cluster) -> None:
    for n in cluster3.nodes:
        await cluster3.wait_listening(n)
    slow = msgspec.structs.replace(spec("rate/slow"), max_append_rate=100_000)
    conn = await Conn.open(cluster3.nodes[0].endpoint)
    assert (await conn.apply(slow, spec("rate/free"))).status == Status.OK
    for j in ("rate/slow", "rate/free"):
        assert (await wait_appendable(cluster3.nodes[0].endpoint, j)).status == Status.OK
    chunks = [b"x" * 10_000] * 30  # 300 kB: 100 kB of burst, then 2 s at the rate
    free = await conn.append("rate/free", chunks)
    assert free.status == Status.OK and free.delayed_chunks == 0 and free.total_chunks == 30
    r = await conn.append("rate/slow", chunks)
    assert r.status == Status.OK, r
    assert r.commit.end - r.commit.begin == 300_000  # throttled, not cut short
    assert r.total_chunks == 30
    # The first 100 kB pass on the burst; every chunk after it waits for tokens.
    assert r.delayed_chunks >= 15, r
    # The bucket is per journal, not per append: a second append right after the first
    # finds no burst left.
    r2 = await conn.append("rate/slow", chunks[:5])
    assert r2.status == Status.OK and r2.delayed_chunks >= 4, r2
    await conn.close()


# -- suspension ----------------------------------------------------------------------------

def _suspended(name: str, level: SuspendLevel) -> JournalSpec:
    return msgspec.structs.replace(spec(name), suspend=Suspend(level=level))


async def _append_until(endpoint: str, journal: str, suspend: str, want: Status,
                        timeout: float = 30.0) -> AppendResponse:
    deadline = time.monotonic() + timeout
    while True:
        conn = await Conn.open(endpoint)
        try:
            r = await conn.append(journal, [], suspend=suspend)
        except Exception:  # noqa: BLE001 - answered early and closed: the route is forming
            r = AppendResponse(status=Status.UNAVAILABLE)
        finally:
            await conn.close()
        if r.status == want or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.1)  # the allocator is still placing the journal


async def test_suspension_resume_no_resume_keep(cluster3: Cluster) -> None:
    for n in cluster3.nodes:
        await cluster3.wait_listening(n)
    ep = cluster3.nodes[0].endpoint
    conn = await Conn.open(ep)
    assert (await conn.apply(_suspended("susp/full", SuspendLevel.FULL),
                             _suspended("susp/partial", SuspendLevel.PARTIAL))).status == Status.OK

    # FULL: nothing is assigned, so no-resume and keep are refused and change nothing.
    r = await conn.append("susp/full", [b"never"], suspend="no-resume")
    assert r.status == Status.SUSPENDED, r
    conn = await Conn.open(ep)  # an early answer closes the connection
    r = await conn.append("susp/full", [], suspend="keep")
    assert r.status == Status.SUSPENDED, r
    conn = await Conn.open(ep)
    assert (await _spec_of(conn, "susp/full")).suspend.level == SuspendLevel.FULL
    # A default (resume) append resumes it first, then lands once replicas are back.
    r = await conn.append("susp/full", [b"hello"])
    assert r.status == Status.OK, r
    assert r.commit.end - r.commit.begin == 5
    assert (await _spec_of(conn, "susp/full")).suspend.level == SuspendLevel.NONE
    listing = await conn.list()
    assert len(next(e.route for e in listing.journals if e.spec.name == "susp/full").members) == 3

    # PARTIAL (one replica): keep appends and leaves the suspension as it is ...
    r = await _append_until(ep, "susp/partial", "keep", Status.OK)
    assert r.status == Status.OK, r
    r = await conn.append("susp/partial", [b"kept"], suspend="keep")
    assert r.status == Status.OK, r
    assert (await _spec_of(conn, "susp/partial")).suspend.level == SuspendLevel.PARTIAL
    # ... no-resume is refused ...
    r = await _append_until(ep, "susp/partial", "no-resume", Status.SUSPENDED)
    assert r.status == Status.SUSPENDED, r
    # ... and resume lifts it, at the offset already written (never writing it twice).
    conn = await Conn.open(ep)
    r = await conn.append("susp/partial", [b"again"])
    assert r.status == Status.OK, r
    resumed = await _spec_of(conn, "susp/partial")
    assert resumed.suspend.level == SuspendLevel.NONE
    assert resumed.suspend.offset == 4 and r.commit.begin == 4
    await conn.close()
