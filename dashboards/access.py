"""Who may see the dashboard's data when the cluster has auth on (docs/security.md).

With keys configured (the cluster's, from QUIRE_AUTH_KEYS / auth_keys_file) `/api/state`
needs a token with the LIST capability, presented as `Authorization: Bearer TOKEN` or as
the `quire_token` cookie that `GET /login?token=TOKEN` sets (HttpOnly, SameSite=Strict,
expiring with the token): a read-only session for a browser. The snapshot then shows
only the journals (and the shards and jobs over them) in the token's scope. The page itself (HTML, JS, CSS) and `/healthz`
carry no data and stay open.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

from protocol import LabelSet
from protocol.auth import Capability, Claims, Keyring, TokenError

__all__ = ["COOKIE", "Denied", "login", "request_token", "require", "visible_state"]

COOKIE = "quire_token"


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def request_token(head: bytes) -> str:
    """The bearer token or the session cookie of a request head ("" if none)."""
    token = ""
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip()
        if name == "cookie":
            for part in value.split(";"):
                k, _, v = part.strip().partition("=")
                if k == COOKIE:
                    token = v
    return token


def require(keyring: Keyring, token: str) -> Claims:
    """Claims allowing LIST, or Denied (401: no/bad token, 403: lacks LIST)."""
    try:
        claims = keyring.verify(token)
    except TokenError as exc:
        raise Denied(401, f"unauthorized: {exc}") from None
    if not claims.caps & Capability.LIST:
        raise Denied(403, "forbidden: the token lacks LIST")
    return claims


def login(keyring: Keyring, target: str) -> str:
    """The Set-Cookie header value for `GET /login?token=…` (Denied if the token is bad)."""
    query = target.partition("?")[2]
    token = (parse_qs(query).get("token") or [""])[0]
    claims = require(keyring, token)
    max_age = max(0, int(claims.expires_at - time.time()))
    return f"{COOKIE}={token}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"


def visible_state(state: dict[str, Any], claims: Claims) -> dict[str, Any]:
    """The snapshot with only the journals (and the shards and jobs over them) in the token's scope."""
    def labels(j: dict[str, Any]) -> LabelSet:
        return LabelSet.of({k: v for k, v in (j.get("labels") or {}).items()})

    journals = [j for j in state.get("journals", []) if claims.scope.covers(j["name"], labels(j))]
    # A shard is shown only when its recovery log and every named source are in scope
    # (its journals' labels are not at hand here: the empty set is the strict reading).
    shards = [s for s in state.get("shards", [])
              if all(claims.scope.covers(n, LabelSet()) for n in
                     (s["recovery_log"], *s["source_journals"]))]
    # A job likewise: its output, the journals its shown runs read and the one its next
    # window waits on must all be in scope, and it must name at least one (a job that has
    # neither output nor runs yet says nothing a scoped token may see).
    from .jobs import journals_of

    jobs = [j for j in state.get("jobs", [])
            if (names := journals_of(j)) and all(claims.scope.covers(n, LabelSet()) for n in names)]
    return {**state, "journals": journals, "shards": shards, "jobs": jobs}
