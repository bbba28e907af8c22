"""What the client retries, how long it waits, and how errors are worded."""

from __future__ import annotations

from protocol import Status
from protocol.errors import StatusError, Unavailable

ROUTING_STATUSES = frozenset({
    Status.NOT_JOURNAL_PRIMARY_BROKER,
    Status.NO_JOURNAL_PRIMARY_BROKER,
    Status.NOT_JOURNAL_BROKER,
    Status.WRONG_ROUTE,
    Status.INSUFFICIENT_JOURNAL_BROKERS,
    Status.UNAVAILABLE,
})
"""Statuses that mean "not committed, ask again (maybe elsewhere)"; the route is dropped.
COMMIT_UNKNOWN is not one: the commit was sent, so the append may have landed (the
client re-sends it only at an explicit offset)."""

BACKOFF = (0.05, 0.1, 0.2, 0.3, 0.5)
"""Capped at 0.5 s. A failover is a lease expiry (the TTL) plus ~0.1 s of allocator and
pipeline sync; with the old 1, 2, 5 s steps the client itself added up to 5 s after the
new route was up (a primary kill took 13.9 s with a 5 s TTL: the retry at 3.9 s was too
early, the next one came at 8.9 s, hit the dead endpoint and slept 5 s). Retrying twice
a second while an append waits costs the cluster nothing measurable, and the retry
timeout still bounds the whole append."""


class Rerouted(Unavailable):
    """An attempt abandoned because its journal's primary moved while it waited
    (reroute.py): the client re-sends at once where the journal went, with no back-off
    and without marking the endpoint down."""


def backoff(attempt: int) -> float:
    return BACKOFF[min(attempt, len(BACKOFF) - 1)]


def strip_status(status: Status, message: str) -> str:
    """A broker message without a leading "STATUS: " (the error prints the status itself)."""
    prefix = Status(status).name + ": "
    return message.removeprefix(prefix)


def reason(exc: StatusError) -> str:
    """The message of a StatusError without the status and journal prefix it renders."""
    text = str(exc)
    prefix = exc.status.name + (f" (journal {exc.journal})" if exc.journal else "")
    return text[len(prefix) + 2:] if text.startswith(prefix + ": ") else text


def is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, StatusError) and exc.status in ROUTING_STATUSES
