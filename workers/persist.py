"""Persist: upload one closed fragment to its store (queue `persist`).

The task asserts the world when it runs (Celery's "pass keys, not objects"):

1. the object under the fragment's content-addressed key exists -> done, nothing
   fetched or uploaded (a retry, a redelivery, or another replica got there first);
2. otherwise stream the raw bytes from a replica over the wire (FetchFragment,
   each given endpoint in turn), compress them with the fragment's codec and upload
   (multipart for large fragments); `fragment_store.persist_fragment` checks length
   and SHA-1 before the upload completes, so a wrong byte never becomes visible;
3. enqueue an index refresh of the journal, so coordinators learn of the new object
   (and drop their local copy) without waiting for the next sweep.

`acks_late` + `task_reject_on_worker_lost` (workers.app): a worker killed mid-upload
leaves the message unacknowledged, Redis redelivers it after the visibility
timeout, and step 1 or 2 runs again — an incomplete multipart upload is never
visible, so the object is written exactly once.
"""

from __future__ import annotations

from typing import Any

import msgspec
from celery.exceptions import SoftTimeLimitExceeded

from fragment_store import (
    ChecksumMismatch,
    StoreUnavailable,
    fragment_key,
    list_fragments,
    persist_fragment,
)
from protocol.logs import bind, get_logger
from protocol import Fragment, ValidationError
from workers import common, metrics, persist_failures, signing
from workers.app import app
from workers.errors import RETRIABLE, FragmentNotLocal
from workers.fetch import fetch_fragment

__all__ = ["persist"]

log = get_logger(__name__)

_RETRY_ON = (*RETRIABLE, StoreUnavailable, ChecksumMismatch, SoftTimeLimitExceeded)


def _decode(fragment: dict[str, Any]) -> Fragment:
    try:
        f = msgspec.convert(fragment, Fragment)
    except msgspec.ValidationError as exc:
        raise ValidationError("fragment", str(exc)) from None
    f.validate()
    if f.begin == f.end:
        raise ValidationError("fragment", "an empty fragment is never persisted")
    return f


class StoreNotAllowed(ValidationError):
    """A persist message names a store this worker is not configured for."""


def check_store(store_url: str) -> None:
    """Refuse a store that is neither this worker's QUIRE_STORE_URL nor one of
    QUIRE_WORKER_STORES: a forged message must not make a worker write anywhere."""
    allowed = {common.settings().store_url, *common.worker_settings().stores}
    if store_url not in allowed:
        raise StoreNotAllowed("store", f"{store_url!r} is not a store this worker writes to "
                                       "(QUIRE_STORE_URL / QUIRE_WORKER_STORES)")


def persist(fragment: Fragment, endpoints: list[str], store_url: str) -> dict[str, Any]:
    """The task body, callable without Celery (used by the task and its tests)."""
    ws = common.worker_settings()
    if signing.enabled() or ws.stores:  # auth on, or stores listed: only those
        check_store(store_url)
    st = common.store(store_url)
    key = fragment_key(fragment)
    result = {"store": store_url, "key": key, "bytes": fragment.content_length}
    if st.exists(key):
        metrics.PERSIST_OBJECTS.labels("exists").inc()
        log.info("fragment already persisted", key=key)
        return {**result, "result": "exists"}
    chunks = fetch_fragment(endpoints, fragment, timeout=ws.io_timeout,
                            read_rate=ws.persist_read_rate)
    try:
        persist_fragment(st, fragment, chunks)
    except FragmentNotLocal:
        # Replicas drop local fragments once the index covers them — possibly with a
        # larger fragment another replica rolled — so this one may never exist.
        if any(r.begin <= fragment.begin and fragment.end <= r.end
               for r in list_fragments(st, fragment.journal)):
            metrics.PERSIST_OBJECTS.labels("covered").inc()
            log.info("fragment covered by persisted fragments; nothing to do", key=key)
            return {**result, "result": "covered"}
        raise
    finally:
        chunks.close()
    metrics.PERSIST_OBJECTS.labels("uploaded").inc()
    metrics.PERSIST_BYTES.inc(fragment.content_length)
    log.info("fragment persisted", key=key, bytes=fragment.content_length)
    return {**result, "result": "uploaded"}


@app.task(name="workers.persist.persist_fragment", bind=True, acks_late=True,
          autoretry_for=_RETRY_ON, retry_backoff=True, retry_backoff_max=120,
          retry_jitter=True, max_retries=8)
def persist_fragment_task(self: Any, fragment: dict[str, Any], endpoints: list[str],
                          store: str) -> dict[str, Any]:
    f = _decode(fragment)
    with bind(journal=f.journal, fragment=f"{f.begin:x}-{f.end:x}", task_id=self.request.id,
              attempt=self.request.retries):
        try:
            out = persist(f, list(endpoints), store)
        except Exception as exc:
            reason = persist_failures.record_failure(f.journal, store, exc,
                                                     str(self.request.hostname or ""))
            log.warning("persist attempt failed", reason=reason, store=store,
                        error=f"{type(exc).__name__}: {exc}")
            raise
    persist_failures.record_success(f.journal)
    # Let coordinators see it now rather than at the next sweep.
    app.send_task("workers.index.refresh_journal", args=[f.journal], queue="index")
    return out
