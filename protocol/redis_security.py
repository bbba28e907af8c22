"""Guarded Redis/Celery channels: TLS options for `rediss://` URLs, signing of every
task message a process publishes, and clear errors for refusals.

A secure cluster's Redis URLs look like

    rediss://quire-worker:PASSWORD@127.0.0.1:6390/0?ssl_ca_certs=/data/tls/ca.pem

(an ACL user per role, TLS verified against the cluster CA). redis-py takes the query
arguments itself; Celery's broker wants them as `broker_use_ssl`, which
`celery_redis_conf` builds. `sign_published_tasks(keys)` hooks Celery's
`before_task_publish` so every message this process sends (by name or not, retries
included) carries its signature header (protocol/task_signing.py).
"""

from __future__ import annotations

import ssl
import threading
import urllib.parse
from typing import Any

from .task_signing import SIGNATURE_HEADER, sign

__all__ = ["celery_redis_conf", "describe_redis_error", "redacted", "redis_ssl_options",
           "sign_published_tasks"]

_SSL_ARGS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_REQS = {"required": ssl.CERT_REQUIRED, "cert_required": ssl.CERT_REQUIRED,
         "optional": ssl.CERT_OPTIONAL, "cert_optional": ssl.CERT_OPTIONAL,
         "none": ssl.CERT_NONE, "cert_none": ssl.CERT_NONE}


def redis_ssl_options(url: str) -> dict[str, Any] | None:
    """The TLS options of a `rediss://` URL (None for `redis://`): the CA to verify the
    server by (`ssl_ca_certs`, required unless `ssl_cert_reqs=none`), and a client
    certificate if Redis asks for one."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "rediss":
        return None
    query = dict(urllib.parse.parse_qsl(parts.query))
    reqs = _REQS.get(query.get("ssl_cert_reqs", "required").lower(), ssl.CERT_REQUIRED)
    opts: dict[str, Any] = {"ssl_cert_reqs": reqs}
    for name in _SSL_ARGS:
        if query.get(name):
            opts[name] = query[name]
    return opts


def celery_redis_conf(url: str) -> dict[str, Any]:
    """Celery settings for a broker/backend URL: with `rediss://`, the TLS options for both
    (Celery refuses a `rediss://` broker without them)."""
    opts = redis_ssl_options(url)
    if opts is None:
        return {}
    return {"broker_use_ssl": opts, "redis_backend_use_ssl": opts}


def redacted(url: str) -> str:
    """`url` without its password (for logs and errors)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def describe_redis_error(exc: BaseException, url: str) -> str:
    """One line naming Redis, the (redacted) URL and why it refused."""
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "noauth" in low or "authentication required" in low or "already authenticated" in low:
        why = "authentication required (the URL has no user and password)"
    elif "wrongpass" in low or "invalid username-password" in low:
        why = "wrong user or password"
    elif "noperm" in low:
        why = f"the ACL user may not do this ({text})"
    elif "ssl" in low or "certificate" in low:
        why = f"TLS handshake failed ({text})"
    elif "connection closed" in low or "reset" in low or "timeout" in low:
        why = f"the server closed the connection (does it speak TLS? use rediss://) ({text})"
    else:
        why = text
    return f"redis at {redacted(url)} refused: {why}"


_signing: dict[str, Any] = {"keys": None}
_install = threading.Lock()


def sign_published_tasks(keys: list[bytes] | None) -> None:
    """Sign every task message this process publishes from now on with `keys[0]`
    (None/empty: stop signing). Idempotent; one receiver per process."""
    from celery.signals import before_task_publish

    with _install:
        _signing["keys"] = list(keys) if keys else None
        if not _signing.get("connected"):
            before_task_publish.connect(_sign_message, weak=False)
            _signing["connected"] = True


def _sign_message(sender: Any = None, body: Any = None, headers: dict[str, Any] | None = None,
                  **_: Any) -> None:
    keys = _signing["keys"]
    if not keys or headers is None:
        return
    args, kwargs = (body[0], body[1]) if isinstance(body, list | tuple) and len(body) >= 2 else ((), {})
    headers[SIGNATURE_HEADER] = sign(keys, str(headers.get("task") or sender),
                                     str(headers.get("id")), args, kwargs)
