"""The chaos run's load: writers that append self-checking records (recording every
outcome in the history), tail readers that follow each journal all run long, and the
client plumbing both use (routes rewritten to the client proxies, attempts traced).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from typing import Any

import msgspec

from protocol import AppendResponse, StatusError
from protocol.errors import CommitUnknown, Unavailable
from quire.client import Client, Producer
from quire.client.routes import RouteCache

from .history import DEFINITE_STATUSES, make_record

__all__ = ["classify", "proxied_routes", "tail", "trace_attempt", "writer"]


def proxied_routes(seeds: list[str], mapping: dict[str, str]) -> RouteCache:
    """A route cache that sends every learned endpoint through its client proxy."""
    return RouteCache(seeds, rewrite=mapping)


_attempts: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("attempts", default=None)


def trace_attempt(endpoint: str, outcome: AppendResponse | BaseException) -> None:
    """Client.on_attempt of the writers' client: records the outcome of every attempt of
    the append in progress (the client retries inside `append`), so a duplicate can be
    traced to the answer that made it retry."""
    log_ = _attempts.get()
    if log_ is None:
        return
    if isinstance(outcome, BaseException):
        log_.append(f"{endpoint}: {type(outcome).__name__}: {outcome}"[:200])
    else:
        log_.append(f"{endpoint}: {outcome.status.name}")


def classify(exc: BaseException) -> str:
    """fail (definitely not committed) or info (unknown)."""
    if isinstance(exc, CommitUnknown):
        # COMMIT_UNKNOWN answered, or the connection was lost / timed out after the
        # commit was sent: the record may appear once or not at all.
        return "info"
    if isinstance(exc, StatusError):
        if "outcome unknown" in str(exc):
            return "info"
        if exc.status in DEFINITE_STATUSES:
            return "fail"
        # Unavailable before the commit was sent, or answered as a routing status by a
        # broker: the client guarantees it was not committed.
        if isinstance(exc, Unavailable):
            return "fail"
    return "info"


async def writer(i: int, client: Client, run: Any, stop: asyncio.Event) -> None:
    """Writer i of the run (`chaos.runner._Run`: cfg, history, journals, cluster, resent)
    until `stop`."""
    cfg, history = run.cfg, run.history
    rng = random.Random(cfg.seed * 1000 + i)
    interval = cfg.writers / cfg.rate
    next_t = time.monotonic()
    seq = 0
    producer = Producer.start(f"chaos-w{i}", run.cluster.workdir / "producers") \
        if cfg.identified else None
    txns: dict[str, Any] = {}  # journal -> its History (one per journal stream)
    while not stop.is_set():
        seq += 1
        # Writer i owns journals i, i+W, ...: a journal that is down stalls only its
        # own writers, and each journal's unavailability shows in its own history.
        journal = rng.choice(run.journals[i % len(run.journals)::cfg.writers]
                             or run.journals)
        uid, data = make_record(i, seq, rng.randint(*cfg.record_bytes), rng)
        op = history.invoke(uid, i, seq, journal, len(data))
        attempts: list[str] = []
        _attempts.set(attempts)
        txn = None
        if producer is not None:
            txn = (txns.get(journal) or txns.setdefault(journal, producer.history())).next()
        unknown = False  # an attempt of this txn may have landed
        resends = 0
        while True:
            try:
                res = await asyncio.wait_for(client.append(journal, data, retry_timeout=10.0,
                                                           txn=txn), cfg.append_timeout)
            except Exception as exc:  # noqa: BLE001 - every outcome is recorded
                outcome = "info" if isinstance(exc, asyncio.TimeoutError) else classify(exc)
                refused = isinstance(exc, StatusError) and 20 <= exc.status < 30
                if txn is not None and not refused and (outcome == "info" or unknown) \
                        and (not stop.is_set() or not unknown):
                    # Identified: re-send the same txn until an authoritative answer (a
                    # definite failure after an unknown one says nothing of the first).
                    unknown = True
                    run.resent += 1
                    resends += 1
                    # Backed off: an answer that comes back at once (a cluster that is
                    # down) must not turn the writer into a busy loop (seen: 271,944
                    # re-sends in a 60 s run on an overloaded machine).
                    await asyncio.sleep(min(1.0, 0.01 * 2 ** min(resends, 7)))
                    continue
                if (outcome == "fail" or refused) and txn is not None and not unknown:
                    txns[journal].unused(txn)  # not written: the next append reuses it
                history.complete(op, "info" if unknown and not refused else
                                 "fail" if refused else outcome,
                                 error=f"{type(exc).__name__}: {exc}"[:300], attempts=attempts)
            else:
                history.complete(op, "ok", begin=res.begin, end=res.end, attempts=attempts)
            break
        next_t += interval
        now = time.monotonic()
        if next_t < now - 1.0:
            next_t = now  # fell behind during a fault: do not burst afterwards
        await asyncio.sleep(max(0.0, next_t - now))


async def tail(client: Client, journal: str, spans: list[tuple[int, bytes]],
                errors: list[str]) -> None:
    """Follow a journal from 0 for the whole run, keeping what it saw (cancelled at the
    end). The Reader retries through route changes; anything else restarts it."""
    offset = 0
    while True:
        try:
            async for off, data in client.read(journal, offset, follow=True):
                if spans and spans[-1][0] + len(spans[-1][1]) == off:
                    spans[-1] = (spans[-1][0], spans[-1][1] + data)
                else:
                    spans.append((off, data))
                offset = off + len(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - counted; the reader starts again
            errors.append(f"{journal}: {type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(0.5)


