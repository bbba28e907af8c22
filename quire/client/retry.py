"""What the client retries, how long it waits, and how errors are worded."""

from __future__ import annotations

from protocol import Status
from protocol.errors import StatusError

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

BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
"""Gazette's RetryReader uses 50ms, 100ms, 1s, 5s; a few more steps smooth failovers."""


def backoff(attempt: int) -> float:
    return BACKOFF[min(attempt, len(BACKOFF) - 1)]


def strip_status(status: Status, message: str) -> str:
    """A broker message without a leading "STATUS: " (the error prints the status itself)."""
    prefix = Status(status).name + ": "
    return message[len(prefix):] if message.startswith(prefix) else message


def reason(exc: StatusError) -> str:
    """The message of a StatusError without the status and journal prefix it renders."""
    text = str(exc)
    prefix = exc.status.name + (f" (journal {exc.journal})" if exc.journal else "")
    return text[len(prefix) + 2:] if text.startswith(prefix + ": ") else text


def is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, StatusError) and exc.status in ROUTING_STATUSES
