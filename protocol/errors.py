"""The exception tree of quire's base layer.

    QuireError
    ├── ValidationError      a value broke a rule; .path names the field ("fragment.stores[1]")
    ├── ProtocolError        hostile or malformed wire input; the connection is closed
    │   └── FrameTooLarge    a frame's declared length is over the limit (checked before reading)
    └── StatusError          a broker answered with a non-OK Status (.status, .journal)
        └── one subclass per Status (JournalNotFound, WrongAppendOffset, …), see for_status()
            (CommitUnknown: the append's commit was sent, its outcome is unknown)

Expected outcomes travel as `Status` values on the wire; only the client edge (and code
that wants to unwind) raises StatusError. Validation and protocol errors are raised at
the edge, before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from .status import Status


class QuireError(Exception):
    """Base of every error quire raises on purpose."""


class ValidationError(QuireError, ValueError):
    """A value is invalid. `path` is the dotted field path, `reason` the rule broken."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        # args = (path, reason) so the error survives pickle and Celery's exception
        # transport, which rebuild it as cls(*args).
        super().__init__(path, reason)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason

    def within(self, parent: str) -> ValidationError:
        """Prefix the path with an enclosing field (validator.go's ExtendContext)."""
        if not parent:
            return self
        if not self.path:
            joined = parent
        elif self.path.startswith("["):
            joined = parent + self.path
        else:
            joined = f"{parent}.{self.path}"
        return ValidationError(joined, self.reason)


class ProtocolError(QuireError):
    """The peer sent bytes that are not a valid frame sequence."""


class FrameTooLarge(ProtocolError):
    """A frame declared a length above the configured limit."""


class StatusError(QuireError):
    """A non-OK status from a broker. Subclasses exist for each Status."""

    status: Status = Status.OK

    def __init__(self, message: str = "", *, journal: str = "", status: Status | None = None,
                 detail: object = None) -> None:
        if status is not None:
            self.status = status
        self.journal = journal
        self.detail = detail
        self.message = message
        text = self.status.name
        if journal:
            text += f" (journal {journal})"
        if message:
            text += f": {message}"
        super().__init__(text)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Rebuild from the original arguments, not from the formatted text.
        return (_rebuild_status_error, (type(self), self.message, self.journal, self.status,
                                        self.detail))

    @property
    def retriable(self) -> bool:
        return self.status.retriable


def _rebuild_status_error(cls: type[StatusError], message: str, journal: str, status: Status,
                          detail: object) -> StatusError:
    return cls(message, journal=journal, status=status, detail=detail)


def _status_class(status: Status) -> type[StatusError]:
    name = "".join(part.capitalize() for part in status.name.split("_"))
    return type(name, (StatusError,), {"status": status, "__doc__": status.__doc__,
                                       "__module__": __name__})


_BY_STATUS: dict[Status, type[StatusError]] = {
    s: _status_class(s) for s in Status if s is not Status.OK
}
globals().update({cls.__name__: cls for cls in _BY_STATUS.values()})

if TYPE_CHECKING:
    # What the assignments below make, as classes a type checker (and mypyc, which
    # compiles the hot path against these types: protocol/native.py) can name.
    class JournalNotFound(StatusError): ...
    class NoJournalPrimaryBroker(StatusError): ...
    class NotJournalPrimaryBroker(StatusError): ...
    class InsufficientJournalBrokers(StatusError): ...
    class NotJournalBroker(StatusError): ...
    class OffsetNotYetAvailable(StatusError): ...
    class WrongRoute(StatusError): ...
    class ProposalMismatch(StatusError): ...
    class EtcdTransactionFailed(StatusError): ...
    class EtcdLimitExceeded(StatusError): ...
    class NotAllowed(StatusError): ...
    class WrongAppendOffset(StatusError): ...
    class IndexHasGreaterOffset(StatusError): ...
    class RegisterMismatch(StatusError): ...
    class Suspended(StatusError): ...
    class FragmentStoreUnhealthy(StatusError): ...
    class BadRequest(StatusError): ...
    class Unavailable(StatusError): ...
    class Aborted(StatusError): ...
    class CommitUnknown(StatusError): ...
    class ShardNotFound(StatusError): ...
    class ShardFenced(StatusError): ...
    class TxnOutOfOrder(StatusError): ...
    class TxnSuperseded(StatusError): ...
    class ProducerGenerationRetired(StatusError): ...
    class HistoryClosed(StatusError): ...
    class Unauthorized(StatusError): ...
    class Forbidden(StatusError): ...
else:
    JournalNotFound = _BY_STATUS[Status.JOURNAL_NOT_FOUND]
    NoJournalPrimaryBroker = _BY_STATUS[Status.NO_JOURNAL_PRIMARY_BROKER]
    NotJournalPrimaryBroker = _BY_STATUS[Status.NOT_JOURNAL_PRIMARY_BROKER]
    InsufficientJournalBrokers = _BY_STATUS[Status.INSUFFICIENT_JOURNAL_BROKERS]
    NotJournalBroker = _BY_STATUS[Status.NOT_JOURNAL_BROKER]
    OffsetNotYetAvailable = _BY_STATUS[Status.OFFSET_NOT_YET_AVAILABLE]
    WrongRoute = _BY_STATUS[Status.WRONG_ROUTE]
    ProposalMismatch = _BY_STATUS[Status.PROPOSAL_MISMATCH]
    EtcdTransactionFailed = _BY_STATUS[Status.ETCD_TRANSACTION_FAILED]
    EtcdLimitExceeded = _BY_STATUS[Status.ETCD_LIMIT_EXCEEDED]
    NotAllowed = _BY_STATUS[Status.NOT_ALLOWED]
    WrongAppendOffset = _BY_STATUS[Status.WRONG_APPEND_OFFSET]
    IndexHasGreaterOffset = _BY_STATUS[Status.INDEX_HAS_GREATER_OFFSET]
    RegisterMismatch = _BY_STATUS[Status.REGISTER_MISMATCH]
    Suspended = _BY_STATUS[Status.SUSPENDED]
    FragmentStoreUnhealthy = _BY_STATUS[Status.FRAGMENT_STORE_UNHEALTHY]
    BadRequest = _BY_STATUS[Status.BAD_REQUEST]
    Unavailable = _BY_STATUS[Status.UNAVAILABLE]
    Aborted = _BY_STATUS[Status.ABORTED]
    CommitUnknown = _BY_STATUS[Status.COMMIT_UNKNOWN]
    ShardNotFound = _BY_STATUS[Status.SHARD_NOT_FOUND]
    ShardFenced = _BY_STATUS[Status.SHARD_FENCED]
    TxnOutOfOrder = _BY_STATUS[Status.TXN_OUT_OF_ORDER]
    TxnSuperseded = _BY_STATUS[Status.TXN_SUPERSEDED]
    ProducerGenerationRetired = _BY_STATUS[Status.PRODUCER_GENERATION_RETIRED]
    HistoryClosed = _BY_STATUS[Status.HISTORY_CLOSED]
    Unauthorized = _BY_STATUS[Status.UNAUTHORIZED]
    Forbidden = _BY_STATUS[Status.FORBIDDEN]
"""The append's commit was sent but its outcome is unknown: it may or may not have
landed (an indefinite failure). Raised for a COMMIT_UNKNOWN answer and by the client
when the connection is lost or times out after it sent the commit."""


_E = TypeVar("_E", bound=BaseException)


def caused(err: _E, cause: BaseException | None) -> _E:
    """`err` with `cause` as its `__cause__`: what `raise err from cause` does, for the
    modules mypyc compiles (protocol/native.py), where `raise ... from` drops the cause
    (mypy 2.4's mypyc; tests/protocol/test_native.py keeps `from` out of them)."""
    err.__cause__ = cause
    return err


def for_status(status: Status) -> type[StatusError]:
    """The StatusError subclass for a non-OK status."""
    return _BY_STATUS[Status(status)]


def raise_for_status(status: Status, message: str = "", *, journal: str = "",
                     detail: object = None) -> None:
    """Raise the matching StatusError unless status is OK."""
    if status != Status.OK:
        raise for_status(status)(message, journal=journal, detail=detail)


def connection_reason(exc: BaseException) -> str:
    """The root reason behind a failed connection, in a few words ("connection refused",
    "no answer (timed out)"), found through causes, contexts and urllib3's `reason`;
    else the first cause's text. For one-line "X unreachable at URL: why" messages."""
    import asyncio

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError) or "Connection refused" in str(e):
            return "connection refused"
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
            return "no answer (timed out)"
        reason = getattr(e, "reason", None)
        todo += [e.__cause__, e.__context__, reason if isinstance(reason, BaseException) else None]
    cause = exc.__cause__ or exc
    return " ".join(str(cause).split())[:200] or type(cause).__name__
