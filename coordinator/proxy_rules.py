"""Pure decisions of a proxied append whose primary did not answer (no IO, no asyncio).

A coordinator that is not a journal's primary forwards the append (append_api.
proxy_append). When its connection to the primary fails before the AppendRequest was
written — nothing of the append reached the primary, so nothing can have been written —
it re-resolves against its own etcd mirror and tries again, within a budget of twice the
lease TTL + 2 s: the primary's host may be isolated (a silent link: a connect hangs
until its timeout), and the coordinators' watch names a new primary once the old one's
lease expired. Once any frame of the append was forwarded it is never re-sent
(append_rules.decide_broken answers UNAVAILABLE or COMMIT_UNKNOWN).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from protocol import Status

__all__ = ["CONNECT_TIMEOUT", "Reproxy", "ReproxyDecision", "decide_reproxy", "reproxy_budget"]

CONNECT_TIMEOUT = 1.0
"""Seconds a hop to a peer coordinator may take to connect (and to answer Hello, see
read_relay.connect_member). A peer on the same network accepts within milliseconds; a
silent link (an isolated host) would otherwise hold a proxied RPC for the OS's timeout."""


class Reproxy(enum.Enum):
    PROXY = "proxy"
    """Connect to `endpoint` (a new primary, or the same one again)."""
    WAIT = "wait"
    """The route names no other reachable primary yet: wait for the keyspace to change."""
    LOCAL = "local"
    """The journal moved to us: run the append here (its content is still unread)."""
    ANSWER = "answer"
    """Give up with `status` (the client retries: nothing was written)."""


@dataclass(frozen=True, slots=True)
class ReproxyDecision:
    action: Reproxy
    endpoint: str = ""
    status: Status = Status.OK
    message: str = ""


def reproxy_budget(lease_ttl: float) -> float:
    """How long a proxied append may look for a reachable primary: a dead or isolated
    primary's lease expires within the TTL, then the allocator names a successor and our
    watch sees it — given as long again (an allocator leader lost with the host, a
    loaded machine), + 2 s. Nothing was forwarded: a client that gives up meanwhile
    (its RPC timeout, its rerouter) loses nothing."""
    return 2 * lease_ttl + 2.0


def decide_reproxy(status: Status, is_primary: bool, endpoint: str | None, failed: str,
                   since_attempt: float, remaining: float,
                   complete: bool = True) -> ReproxyDecision:
    """After a connect to primary `failed` failed (nothing forwarded), given a fresh
    resolution (`status`, `is_primary`: we are its primary now, `endpoint`: its primary's,
    `complete`: its route has the journal's replication — else the allocator is moving
    it and its primary would refuse with INSUFFICIENT_JOURNAL_BROKERS), `since_attempt`
    seconds after that attempt began and with `remaining` of the budget."""
    if status != Status.OK:
        return ReproxyDecision(Reproxy.ANSWER, status=status,
                               message=f"proxy to primary {failed} failed; re-resolving: "
                                       f"{status.name}")
    if is_primary:
        return ReproxyDecision(Reproxy.LOCAL)
    if remaining <= 0:
        return ReproxyDecision(Reproxy.ANSWER, status=Status.UNAVAILABLE,
                               message=f"proxy to primary {failed} failed: no reachable "
                                       "primary within twice the lease TTL + 2 s")
    if not complete:
        return ReproxyDecision(Reproxy.WAIT)
    if endpoint and endpoint != failed:
        return ReproxyDecision(Reproxy.PROXY, endpoint=endpoint)
    if endpoint and since_attempt >= CONNECT_TIMEOUT:
        return ReproxyDecision(Reproxy.PROXY, endpoint=endpoint)  # the same one again
    return ReproxyDecision(Reproxy.WAIT)
