"""The status codes every RPC answers with (Gazette's protocol.proto, same numbers).

Expected outcomes are values, not exceptions: a response carries a `Status` and the
client turns a non-OK one into the matching `StatusError` subclass (see errors.py).
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    OK = 0
    JOURNAL_NOT_FOUND = 1
    """No spec for the journal (or the caller may not see it)."""
    NO_JOURNAL_PRIMARY_BROKER = 2
    """An append, but the route has no primary (route.primary == -1)."""
    NOT_JOURNAL_PRIMARY_BROKER = 3
    """An append with do_not_proxy reached a broker that is not the primary."""
    INSUFFICIENT_JOURNAL_BROKERS = 4
    """The route is empty or has fewer members than the journal's replication."""
    NOT_JOURNAL_BROKER = 5
    """A non-member was asked with do_not_proxy, or received a Replicate."""
    OFFSET_NOT_YET_AVAILABLE = 6
    """A non-blocking read past the write head."""
    WRONG_ROUTE = 7
    """A replica's route differs from the one in the request header."""
    PROPOSAL_MISMATCH = 8
    """The spool cannot apply a proposed fragment."""
    ETCD_TRANSACTION_FAILED = 9
    """An Apply whose expected revision did not match."""
    NOT_ALLOWED = 10
    """The journal's flags or suspension forbid the operation."""
    WRONG_APPEND_OFFSET = 11
    """An explicit append offset differs from the journal's write head."""
    INDEX_HAS_GREATER_OFFSET = 12
    """The fragment index ends past the synchronized spool: consistency was lost."""
    REGISTER_MISMATCH = 13
    """The journal registers did not match the append's check_registers."""
    SUSPENDED = 14
    """The journal is suspended."""
    FRAGMENT_STORE_UNHEALTHY = 15
    """The journal's primary fragment store fails its health checks."""
    # Exactly-once appends (protocol/producers.py, docs/exactly-once.md): codes 20-29.
    TXN_OUT_OF_ORDER = 20
    """An identified append skips ahead of its history: its txn is past the next one
    after the last transaction acted on. Nothing was written."""
    TXN_SUPERSEDED = 21
    """An identified append is behind its history: a later transaction was already
    acted on, so this one was too; its original commit is no longer kept. Nothing was
    written now."""
    PRODUCER_GENERATION_RETIRED = 22
    """The producer started a newer generation: every history of this one is retired.
    Nothing was written."""
    HISTORY_CLOSED = 23
    """The history was closed (a tombstone); the message names the closing txn.
    Nothing was written."""
    # Auth (protocol/auth.py, docs/security.md): codes 30-39.
    UNAUTHORIZED = 30
    """The connection's token is missing, malformed, expired or wrongly signed (refused
    at the Hello, before any request is read)."""
    FORBIDDEN = 31
    """The token is valid but lacks the capability, or the journal is out of its scope;
    the message names both."""
    # Consumer shards (consumers/, docs/consumers.md): codes 40-49.
    SHARD_NOT_FOUND = 40
    """No ShardSpec with that id."""
    SHARD_FENCED = 41
    """A shard's recovery log is fenced by a newer primary: this process may no longer
    write the shard (a zombie primary after its lease expired)."""
    # quire additions (beyond Gazette's codes) start at 64 so they never collide.
    BAD_REQUEST = 64
    """A request failed validation (the message names the field)."""
    UNAVAILABLE = 65
    """The broker is shutting down or a peer/etcd could not be reached; retry."""
    ABORTED = 66
    """The append was aborted (client error, disconnect, timeout, too slow)."""
    COMMIT_UNKNOWN = 67
    """The append failed after its commit proposal was sent to a replica (or, when
    proxied, after the commit was forwarded to the primary): replicas may have adopted
    it, and a later pipeline sync may make it visible. The outcome is unknown, so the
    append must not be re-sent blindly (it could land twice). Not retriable; an
    *indefinite* failure. Every status answered before the commit was sent is definite."""
    SPOOL_FULL = 68
    """A member's spool cannot take the append's bytes now: its filesystem is full
    (ENOSPC), below the configured low-water mark, or the member holds more unpersisted
    content than its bound (the store is behind). The message names the member and the
    reason. Nothing was written; appends resume by themselves once room returns."""
    SPOOL_FAILED = 69
    """A member's spool failed for good (EIO, a read-only filesystem): the member
    refuses every write and gives its journals to healthy members; the message names
    the member and the error. Nothing was written; retry once the route moved."""
    ETCD_LIMIT_EXCEEDED = 70
    """etcd refused a transaction over one of its limits: too many operations
    (`--max-txn-ops`, 128 by default) or a request too large (`--max-request-bytes`,
    1.5 MiB by default). The message names the limit and the flag that makes smaller
    transactions (`--max-txn-size`). Nothing of that transaction was written; not
    retriable as it is."""
    FRAGMENT_CORRUPT = 71
    """A read reached a persisted fragment whose every stored copy failed its SHA-1
    proof (fragment_store/verified.py) and no member holds it: the message names the
    journal, the fragment and the stores. No byte of it was sent."""

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {
        Status.NO_JOURNAL_PRIMARY_BROKER,
        Status.NOT_JOURNAL_PRIMARY_BROKER,
        Status.INSUFFICIENT_JOURNAL_BROKERS,
        Status.NOT_JOURNAL_BROKER,
        Status.WRONG_ROUTE,
        Status.UNAVAILABLE,
    }
)
