"""Signed Celery task messages (pure: HMAC over a canonical body; no IO, no Celery).

Whoever can write to the broker can put any message on a worker's queue. With auth on,
every task message carries an HMAC-SHA256 over its canonical form — task name, id,
positional and keyword arguments — under a key derived from the cluster's first token
key; a worker recomputes it with each configured key (rotation, like tokens) and refuses
the message when none matches (workers.signing).

Why an HMAC of our own and not Celery's `task_serializer='auth'`: Celery's signer needs
an X.509 key pair per sender and a certificate store on every worker, signs only the
body (not the task name, which travels in a header), and replaces the JSON serializer
for the whole app. quire already distributes one secret to every process that sends or
runs tasks (the token keys: coordinators, workers, beat, the operator's CLI), so a
derived HMAC key adds no new secret to manage, covers the task name, and costs one
SHA-256 per message. The derived key (HMAC(token key, "quire task signing v1")) keeps a
task signature from ever being usable as a token signature or the reverse.

Replays: a message copied off the broker can be pushed again. Every quire task is
idempotent (persist, index, pulse), except the destructive ones (`prune_journal`,
`purge_journal`), which also carry a capability token with APPLY on their journal that
lives minutes (`DESTRUCTIVE_TTL`): a replayed deletion is refused once it expires.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import QuireError

__all__ = ["DESTRUCTIVE_TASKS", "DESTRUCTIVE_TTL", "SIGNATURE_HEADER", "TaskSignatureError",
           "canonical", "sign", "signing_keys", "verify"]

SIGNATURE_HEADER = "quire_sig"
"""The message header carrying the hex HMAC."""
DESTRUCTIVE_TASKS = frozenset({"workers.prune.prune_journal", "workers.prune.purge_journal"})
"""Tasks that delete objects: they also need an APPLY token (keyword `capability`)."""
DESTRUCTIVE_TTL = 300.0
"""Lifetime of the APPLY token a destructive task carries; a longer-lived one is refused."""
_CONTEXT = b"quire task signing v1"


class TaskSignatureError(QuireError):
    """A task message is unsigned, or its signature matches no key."""


def signing_keys(token_keys: Iterable[bytes]) -> list[bytes]:
    """The task-signing keys derived from the token keys, in the same order (first signs)."""
    return [hmac.new(k, _CONTEXT, hashlib.sha256).digest() for k in token_keys]


def canonical(task: str, task_id: str, args: Sequence[Any] | None,
              kwargs: dict[str, Any] | None) -> bytes:
    """The bytes signed: the JSON of [task, id, args, kwargs], keys sorted, no spaces (a
    tuple and a list sign alike, as JSON carries both as a list)."""
    return json.dumps([task, task_id, list(args or ()), dict(kwargs or {})], sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sign(keys: Sequence[bytes], task: str, task_id: str, args: Sequence[Any] | None,
         kwargs: dict[str, Any] | None) -> str:
    return hmac.new(keys[0], canonical(task, task_id, args, kwargs), hashlib.sha256).hexdigest()


def verify(keys: Sequence[bytes], signature: object, task: str, task_id: str,
           args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> None:
    """Raise TaskSignatureError unless `signature` is this message's HMAC under one key."""
    if not isinstance(signature, str) or not signature:
        raise TaskSignatureError(f"task {task} ({task_id}) is not signed")
    try:
        body = canonical(task, task_id, args, kwargs)
    except (TypeError, ValueError) as exc:
        raise TaskSignatureError(f"task {task} ({task_id}): arguments cannot be "
                                 f"canonicalized: {exc}") from None
    for key in keys:
        if hmac.compare_digest(hmac.new(key, body, hashlib.sha256).hexdigest(), signature):
            return
    raise TaskSignatureError(f"task {task} ({task_id}): signature matches no key")
