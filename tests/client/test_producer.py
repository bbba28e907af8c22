"""Client-side exactly-once identifiers: persisted generations, histories, TxnId."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from protocol import AppendRequest
from protocol.errors import ValidationError
from quire.client import Producer, TxnId


def test_generation_is_persisted_and_incremented_once_per_start(tmp_path: Path) -> None:
    a = Producer.start("billing/7", tmp_path)
    b = Producer.start("billing/7", tmp_path)
    other = Producer.start("other", tmp_path)
    assert (a.generation, b.generation, other.generation) == (1, 2, 1)
    assert (tmp_path / "billing%2F7.generation").read_text().strip() == "2"
    assert not list(tmp_path.glob("*.tmp"))


def _start(root: str, q) -> None:  # noqa: ANN001
    q.put(Producer.start("racer", root).generation)


def test_concurrent_starts_get_distinct_generations(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_start, args=(str(tmp_path), q)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert sorted(q.get(timeout=5) for _ in procs) == [1, 2, 3, 4, 5, 6]


def test_histories_and_txns(tmp_path: Path) -> None:
    p = Producer.start("w", tmp_path)
    h1, h2 = p.history(), p.history()
    assert (h1.id, h2.id) == (1, 2)
    t1, t2 = h1.next(), h1.next()
    assert (t1.txn, t2.txn, h2.next().txn) == (1, 2, 1)
    h1.unused(t2)  # refused: its number is reused
    assert h1.next() == t2
    req = AppendRequest(journal="a/b", **t2.closing().fields())
    assert (req.producer, req.generation, req.history, req.txn, req.close_history) == \
        ("w", p.generation, 1, 2, True)


def test_invalid_identifiers_are_refused_at_the_edge(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="producer"):
        Producer.start("bad name", tmp_path)
    with pytest.raises(ValidationError, match="txn"):
        TxnId("w", 1, 1, 0)
    with pytest.raises(ValidationError, match="close_history"):
        TxnId("w", 1, 0, 1, close_history=True)
    (tmp_path / "junk.generation").write_text("not a number")
    with pytest.raises(ValueError, match="not a generation number"):
        Producer.start("junk", tmp_path)
