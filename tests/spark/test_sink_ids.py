"""The sinks' exactly-once identifiers and options (spark/exactly_once.py,
spark/appender.py), and the task write path against a real coordinator without Spark:
two writes with one `idempotency_key` land once; a re-run with the same messages in
another order is accepted; one with other rows fails with ReplayMismatch."""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
import pytest

from spark.appender import ReplayMismatch, parse_sink_options, write_task
from spark.exactly_once import MAX_PARTITION, SinkIdentityError, TaskIds, producer_for
from spark.options import OptionError
from tests.spark.stream_helpers import make_journals


def test_identifiers_are_deterministic_and_disjoint() -> None:
    assert TaskIds.batch("write/abc", 0) == TaskIds.batch("write/abc", 0)
    assert TaskIds.batch("write/abc", 0).history == 1
    assert TaskIds.batch("write/abc", 0) != TaskIds.batch("write/abd", 0)
    batch = {TaskIds.batch("k", p).history for p in range(100)}
    stream = {TaskIds.stream("k", b, p).history for b in range(20) for p in range(100)}
    assert len(batch) == 100 and len(stream) == 2000 and not batch & stream
    txn = TaskIds.stream("query/q-1", 3, 2).txn()
    assert (txn.producer, txn.generation, txn.txn) == ("sink/query/q-1", 1, 1)
    # Keys that are not tokens (or too long) become a SHA-1, always a valid producer.
    for key in ("job/window 2026-01-01T00:00", "x" * 300, "é"):
        name = producer_for(key)
        assert name.startswith("sink/sha1.") and name == producer_for(key)
    with pytest.raises(SinkIdentityError, match="partition"):
        TaskIds.batch("k", MAX_PARTITION + 1)


def test_sink_options() -> None:
    opts = parse_sink_options({"brokers": "h:1", "journal": "a/bb"}, ["n"])
    assert opts.exactly_once and opts.idempotency_key == ""
    opts = parse_sink_options({"brokers": "h:1", "journal": "a/bb", "exactlyOnce": "false"},
                              ["n"])
    assert not opts.exactly_once
    opts = parse_sink_options({"brokers": "h:1", "journal": "a/bb",
                               "idempotency_key": "job-7/w-3"}, ["n"])
    assert opts.idempotency_key == "job-7/w-3"
    for bad, match in (({"exactly_once": "maybe"}, "'exactly_once'"),
                       ({"idempotency_key": " "}, "'idempotency_key'"),
                       ({"idempotency_key": "k", "exactly_once": "false"}, "'idempotency_key'")):
        with pytest.raises(OptionError, match=match):
            parse_sink_options({"brokers": "h:1", "journal": "a/bb", **bad}, ["n"])


def _rows(ns: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"n": n} for n in ns])


def test_same_key_lands_once_and_replays_are_checked(stream_cluster: Any) -> None:
    from quire.client import SyncClient

    journal = "sink/ids/keyed-000"
    brokers = ",".join(stream_cluster.endpoints)
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [journal])
        opts = parse_sink_options({"brokers": brokers, "journal": journal,
                                   "idempotency_key": "job-7/window-3"}, ["n"])
        ids = TaskIds.batch(opts.idempotency_key, 0)
        first = write_task(iter([_rows(list(range(10)))]), opts, ids)
        # Another "application", same key and partition: answered with the first commit.
        again = write_task(iter([_rows(list(range(10)))]), opts, ids)
        assert again == first
        # The same messages in another order (a shuffle's fetch order): accepted.
        assert write_task(iter([_rows(list(range(9, -1, -1)))]), opts, ids)[0][1:3] == \
            first[0][1:3]
        # Other rows for the same partition would be dropped: refused, loudly.
        with pytest.raises(ReplayMismatch, match="already committed"):
            write_task(iter([_rows(list(range(5)))]), opts, ids)
        # Another partition of the key is another transaction.
        write_task(iter([_rows([100])]), opts, TaskIds.batch(opts.idempotency_key, 1))
        lines = client.read_all(journal).splitlines()
        # A fresh commit's sum is the SHA-1 of the bytes sent, so the sink reads back
        # only when a re-send was answered with other content.
        data = b'{"n":101}\n'
        commit = client.append(journal, data, txn=TaskIds.batch("k/sum", 0).txn()).commit
        assert commit is not None and commit.sum == hashlib.sha1(data).hexdigest()
    assert lines == [b'{"n":%d}' % n for n in [*range(10), 100]]
