"""proxy_rules.decide_reproxy: what a proxied append does after its primary did not
answer a connect (nothing of the append forwarded yet)."""

from __future__ import annotations

from coordinator.proxy_rules import CONNECT_TIMEOUT, Reproxy, decide_reproxy, reproxy_budget
from protocol import Status


def test_a_new_primary_is_proxied_to_at_once() -> None:
    d = decide_reproxy(Status.OK, False, "127.0.0.3:8080", "127.0.0.2:8080", 0.01, 5.0)
    assert (d.action, d.endpoint) == (Reproxy.PROXY, "127.0.0.3:8080")


def test_the_same_primary_is_tried_again_only_after_a_connect_timeout() -> None:
    assert decide_reproxy(Status.OK, False, "p:1", "p:1", 0.2, 5.0).action is Reproxy.WAIT
    d = decide_reproxy(Status.OK, False, "p:1", "p:1", CONNECT_TIMEOUT, 5.0)
    assert (d.action, d.endpoint) == (Reproxy.PROXY, "p:1")


def test_no_primary_yet_or_a_route_being_moved_waits_for_the_route() -> None:
    assert decide_reproxy(Status.OK, False, None, "p:1", 3.0, 2.0).action is Reproxy.WAIT
    d = decide_reproxy(Status.OK, False, "q:1", "p:1", 3.0, 2.0, complete=False)
    assert d.action is Reproxy.WAIT


def test_the_budget_spent_answers_unavailable_never_commit_unknown() -> None:
    d = decide_reproxy(Status.OK, False, "p:1", "p:1", 3.0, 0.0)
    assert (d.action, d.status) == (Reproxy.ANSWER, Status.UNAVAILABLE)
    assert "p:1" in d.message


def test_the_journal_moved_here_or_resolution_failed_answers() -> None:
    assert decide_reproxy(Status.OK, True, "me:1", "p:1", 0.1, 5.0).action is Reproxy.LOCAL
    d = decide_reproxy(Status.JOURNAL_NOT_FOUND, False, None, "p:1", 0.1, 5.0)
    assert (d.action, d.status) == (Reproxy.ANSWER, Status.JOURNAL_NOT_FOUND)


def test_the_budget_is_twice_the_lease_ttl_plus_two_seconds() -> None:
    assert reproxy_budget(3.0) == 8.0
