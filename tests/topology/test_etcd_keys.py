"""The key layout of docs/architecture.md, and its parsing."""

from __future__ import annotations

import pytest

from topology.etcd import (
    MalformedKey,
    assignment_key,
    journal_key,
    leader_key,
    member_key,
    parse_assignment_key,
    parse_journal_key,
    parse_member_key,
)
from protocol import ProcessId

P = ProcessId("us-east", "broker-1")


def test_layout_matches_architecture_doc() -> None:
    assert journal_key("/quire", "a/b/c") == "/quire/journals/a/b/c"
    assert member_key("/quire", P) == "/quire/members/us-east#broker-1"
    assert assignment_key("/quire", "a/b", P, 2) == "/quire/assign/a/b#us-east#broker-1#2"
    assert leader_key("/quire/") == "/quire/allocator/leader"


def test_round_trips() -> None:
    key = assignment_key("/r", "logs/x=1/y", P, 0)
    assert parse_assignment_key("/r", key) == ("logs/x=1/y", P, 0)
    assert parse_member_key("/r", member_key("/r", P)) == P
    assert parse_journal_key("/r", journal_key("/r", "a/b")) == "a/b"


@pytest.mark.parametrize("key", ["/r/assign/j#a#b", "/r/assign/j#a#broker-1#x",
                                 "/r/assign/#a#broker-1#0", "/other/assign/j#a#broker-1#0",
                                 "/r/assign/j#a#b!#0"])
def test_malformed_assignment_keys(key: str) -> None:
    with pytest.raises(MalformedKey):
        parse_assignment_key("/r", key)
