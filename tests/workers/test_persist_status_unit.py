"""The persistence status records (fragment_store/persist_status.py) and the reasons a
persist attempt is given (workers/persist_failures.py), without services."""

from __future__ import annotations

import msgspec
from celery.exceptions import SoftTimeLimitExceeded

from fragment_store import ChecksumMismatch, StoreUnavailable
from fragment_store.persist_status import PersistBacklog, PersistFailure, parse_backlog, parse_failures
from protocol import ValidationError
from workers.errors import FragmentNotLocal, ReplicaUnavailable
from workers.persist import StoreNotAllowed
from workers.persist_failures import classify


def test_backlog_entries_age_and_go_stale() -> None:
    fresh = PersistBacklog(bytes=10, fragments=1, oldest=100.0, coordinator="z#a", updated=190.0)
    stale = PersistBacklog(bytes=5, oldest=50.0, updated=100.0)
    raw = {b"a": msgspec.json.encode(fresh), b"b": msgspec.json.encode(stale), b"c": b"{oops"}
    got = parse_backlog(raw, now=200.0, stale_after=30.0)
    assert got == {"a": fresh}
    assert got["a"].age(200.0) == 100.0
    assert PersistBacklog(bytes=0, oldest=1.0).age(5.0) == 0.0


def test_failures_decode_and_skip_garbage() -> None:
    f = PersistFailure(reason="store_not_allowed", message="m", store="file:///x/", count=3)
    assert parse_failures({"j": msgspec.json.encode(f), "k": b"[]"}) == {"j": f}


def test_each_failure_has_a_reason() -> None:
    assert classify(StoreNotAllowed("store", "no")) == "store_not_allowed"
    assert classify(StoreUnavailable("down")) == "store_unavailable"
    assert classify(FragmentNotLocal("gone")) == "fetch_failed"
    assert classify(ReplicaUnavailable("refused")) == "fetch_failed"
    assert classify(ChecksumMismatch("sum")) == "checksum"
    assert classify(SoftTimeLimitExceeded()) == "timeout"
    assert classify(ValidationError("fragment", "bad")) == "invalid"
    assert classify(RuntimeError("?")) == "other"
