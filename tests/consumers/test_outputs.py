"""The output ledger (consumers/outputs.py): identifiers of a shard's outputs, and a
property of the generation decision against the broker's real producer table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.faults import fault_point
from consumers.outputs import LEDGER_KEY, OutputLedger, ledger_of, producer_name
from coordinator.producers import ProducerTable
from protocol import ProducerMark
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


# -- the generation decision, against the broker's real producer table ----------------



class Broker:
    """Output journals with the primary's dedup (coordinator/producers.py)."""

    def __init__(self) -> None:
        self.tables: dict[str, ProducerTable] = {}
        self.content: dict[str, list[bytes]] = {}

    def append(self, producer: str, intent) -> str:  # noqa: ANN001
        t = self.tables.setdefault(intent.journal, ProducerTable(intent.journal))
        v = t.check(producer, intent.generation, intent.history, intent.txn)
        if v.new:
            data = self.content.setdefault(intent.journal, [])
            data.append(intent.data)
            t.apply(ProducerMark(producer, intent.generation, intent.history, intent.txn,
                                 len(data) - 1, len(data), "s", 0))
            return "written"
        return v.status.name if v.original is None else "original"


steps = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.lists(st.sampled_from(["out/a", "out/b"]), max_size=3),
              st.sampled_from(["sent", "crash-before", "crash-midway"])),
    st.tuples(st.just("zombie")),
), max_size=25)


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_each_committed_output_lands_once_whatever_the_crashes(steps) -> None:  # noqa: ANN001
    """Primaries take over one after another (each after a crash or a hand-off); each
    re-sends the stored ledger's intents under their generation, then commits under its
    own. A replaced primary's late sends (a zombie) never write. In the end every
    committed output is in its journal exactly once, in commit order."""
    producer, broker = "shards/s", Broker()
    stored: bytes | None = None
    committed: list = []
    zombies: list = []  # late sends of replaced primaries

    def take_over() -> OutputLedger:
        led = OutputLedger(producer, stored)
        for i in led.start():
            assert broker.append(producer, i) in ("written", "original", "TXN_SUPERSEDED")
        return led

    led = take_over()
    n = 0
    for step in steps:
        if step[0] == "zombie":
            for i in zombies:
                assert broker.append(producer, i) != "written", i
            continue
        _, journals, outcome = step
        n += 1
        op, intents = led.commit([(j, b"%d:%s\n" % (n, j.encode())) for j in journals])
        stored = op[1]  # the batch is durable: the ledger with it
        led.committed(op)
        committed += intents
        sent = {"sent": intents, "crash-before": [], "crash-midway": intents[:1]}[outcome]
        for i in sent:
            assert broker.append(producer, i) == "written"
        if outcome != "sent":
            zombies = list(intents)  # it may yet send them, late
            led = take_over()
    for i in zombies:
        assert broker.append(producer, i) != "written"
    for journal in ("out/a", "out/b"):
        assert broker.content.get(journal, []) == [i.data for i in committed if i.journal == journal]
