"""The output ledger (consumers/outputs.py): identifiers of a shard's outputs."""

from __future__ import annotations

import pytest

from consumers.faults import fault_point
from consumers.outputs import LEDGER_KEY, OutputLedger, ledger_of, producer_name
from protocol.producers import validate_identity


def test_producer_name_is_stable_and_always_a_valid_token() -> None:
    assert producer_name("counts/part-000") == "shards/counts/part-000"
    long = "a/" * 100 + "b"
    name = producer_name(long)
    assert name == producer_name(long) and name.startswith("shards/") and len(name) <= 128
    validate_identity(name, 1, 1, 1)
    assert producer_name("x=1%2") != producer_name("x=1%3")  # '=' and '%' are hashed


def test_histories_per_output_journal_and_intents_of_the_last_commit() -> None:
    led = OutputLedger("shards/s", None)
    with pytest.raises(RuntimeError):
        led.commit([])
    assert led.start() == [] and led.generation == 1
    op, intents = led.commit([("out/a", b"1\n"), ("out/b", b"2\n"), ("out/a", b"3\n")])
    assert op[0] == LEDGER_KEY
    assert [(i.journal, i.generation, i.history, i.txn, i.data) for i in intents] == [
        ("out/a", 1, 1, 1, b"1\n3\n"), ("out/b", 1, 2, 1, b"2\n")]
    led.committed(op)
    op, intents = led.commit([("out/b", b"4\n")])
    assert [(i.journal, i.history, i.txn) for i in intents] == [("out/b", 2, 2)]
    led.committed(op)
    # A commit without outputs clears the intents (they were acknowledged), keeps counters.
    quiet, none = led.commit([])
    assert none == [] and ledger_of([quiet]).intents == [] and \
        ledger_of([quiet]).histories == {"out/a": (1, 1), "out/b": (2, 2)}

    # A new primary: re-send the last commit's intents under THEIR generation, then bump.
    nxt = OutputLedger("shards/s", op[1])
    resend = nxt.start()
    assert [(i.journal, i.generation, i.history, i.txn) for i in resend] == [("out/b", 1, 2, 2)]
    assert resend[0].txn_id("shards/s").generation == 1 and nxt.generation == 2
    _, intents = nxt.commit([("out/a", b"5\n"), ("out/c", b"6\n")])
    assert [(i.journal, i.generation, i.history, i.txn) for i in intents] == [
        ("out/a", 2, 1, 2), ("out/c", 2, 3, 1)]


def test_fault_point_is_inert_without_its_variable(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("QUIRE_CONSUMER_FAULT", raising=False)
    fault_point("after-commit")
    monkeypatch.setenv("QUIRE_CONSUMER_FAULT", "after-outputs@2")
    fault_point("after-commit")  # another point: nothing happens
