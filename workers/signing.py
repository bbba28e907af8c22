"""The worker's check of every task message (protocol/task_signing.py): the app's task
base class verifies, before a task body runs, that the message is signed with one of the
cluster's keys, and for a destructive task (`prune_journal`, `purge_journal`) that its
`capability` argument is a live, short-lived token with APPLY on the journal.

A message that fails is refused: logged (task, id, reason — never the token), counted in
`quire_worker_refused_tasks_total{task, reason}` and rejected without a requeue, so a
forged message runs nothing and is not retried. Off when the worker has no keys (auth
off: `quire up`, `make run`).
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.exceptions import Reject

from protocol.auth import LEEWAY, Capability, Keyring, TokenError
from protocol.logs import get_logger
from protocol.task_signing import (
    DESTRUCTIVE_TASKS,
    DESTRUCTIVE_TTL,
    SIGNATURE_HEADER,
    TaskSignatureError,
    verify,
)
from workers import metrics

__all__ = ["SignedTask", "check_message", "configure", "enabled"]

log = get_logger(__name__)

_state: dict[str, Any] = {"keyring": None, "keys": None}


def configure(keyring: Keyring | None) -> None:
    """The keyring messages are checked against (None: no checks)."""
    _state["keyring"] = keyring
    _state["keys"] = keyring.task_keys() if keyring is not None else None


def enabled() -> bool:
    """Whether messages are checked (the worker has the cluster's keys)."""
    return _state["keyring"] is not None


def _journal_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    return kwargs.get("journal", args[0] if args else None)


def check_message(name: str, task_id: str, signature: object, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """None if the message may run; else (reason label, message) of its refusal."""
    keyring: Keyring | None = _state["keyring"]
    if keyring is None:
        return None
    try:
        verify(_state["keys"], signature, name, task_id, args, kwargs)
    except TaskSignatureError as exc:
        return ("unsigned" if not signature else "bad_signature"), str(exc)
    if name not in DESTRUCTIVE_TASKS:
        return None
    journal = _journal_of(args, kwargs)
    try:
        claims = keyring.verify(kwargs.get("capability"))
    except TokenError as exc:
        return "no_apply_token", f"task {name} on {journal}: capability token refused: {exc}"
    if claims.expires_at - claims.issued_at > DESTRUCTIVE_TTL + LEEWAY:
        return "no_apply_token", (f"task {name} on {journal}: capability token lives "
                                  f"{claims.expires_at - claims.issued_at:g}s, more than "
                                  f"{DESTRUCTIVE_TTL:g}s")
    if not isinstance(journal, str) or not claims.allows(Capability.APPLY, journal):
        return "no_apply_token", f"task {name}: token lacks APPLY on journal {journal}"
    return None


class SignedTask(Task):
    """Base of every task of workers.app: refuses unverified messages before `run`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if _state["keyring"] is not None and not request.called_directly:
            refusal = check_message(self.name, str(request.id), request.get(SIGNATURE_HEADER),
                                    args, kwargs)
            if refusal is not None:
                reason, message = refusal
                metrics.REFUSED_TASKS.labels(self.name, reason).inc()
                log.warning("task refused", task=self.name, task_id=request.id, reason=reason,
                            error=message)
                raise Reject(message, requeue=False)
        return super().__call__(*args, **kwargs)
