"""Capability tokens and the authorizer (pure: no IO, no clock unless given one).

A token is an HS256 JWT (PyJWT, algorithm pinned in code) whose claims say *what* the
bearer may do and *where*:

    sub   who (logged on refusals; never the token itself)
    cap   ["append", "read", …] ⊆ CAPABILITIES
    pfx   ["team-a/", "ops/audit-log", "*"]  `/`-terminated prefixes, exact journal
          names, or `*` (every journal)
    sel   "team=a, !secret"  a label selector over the journal's labels plus the
          `name` / `prefix` meta-labels
    iat, nbf, exp   checked with LEEWAY seconds of clock skew; exp is required
    aud   the cluster's audience (default "quire")

A journal is in scope if it matches `pfx` (when given) *and* `sel` (when given); a token
must carry at least one of them. Prefix matching is on validated names only, by whole
segments: `team-a/` covers `team-a/x` but not `team-ab/x`.

`Keyring` holds the keys: the first signs, any verifies (rotation). Every
malformed, oversized, expired, not-yet-valid, wrongly-signed or `alg: none` token raises
`TokenError` from `Keyring.verify`, before any request is looked at.

`requirement(msg)` is the one place that maps an RPC to the capability it needs and the
journal it touches; `authorize(claims, msg, labels_of)` checks a request against it and
returns a `Refusal` naming both, or None. Coordinators call it at their RPC entry;
clients and roles use `mint`/`derive` to make tokens. Reading keys and tokens from
files and settings is protocol/credentials.py's job.
"""

from __future__ import annotations

import base64
import binascii
import enum
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jwt
import msgspec

from .errors import QuireError, ValidationError
from .labels import LabelSelector, LabelSet, parse_selector
from .messages import (
    AppendRequest,
    ApplyRequest,
    FetchFragmentRequest,
    ListBrokersRequest,
    ListFragmentsRequest,
    ListRequest,
    ReadRequest,
    ReplicateProposal,
)
from .names import JOURNAL_NAME_MAX, validate_journal_name, validate_path
from .spec import JournalSpec

__all__ = [
    "ALGORITHM", "Capability", "Claims", "Keyring", "Refusal", "Scope", "TokenError",
    "authorize", "authorize_apply", "decode_keys", "parse_caps", "requirement",
]

ALGORITHM = "HS256"
"""The only algorithm signed or accepted: a token's header cannot choose another."""
LEEWAY = 5.0
"""Seconds of clock skew allowed on exp / nbf / iat."""
MAX_TOKEN_BYTES = 4096
"""Longer tokens are refused unread (no base64 or JSON work on hostile input)."""
MAX_TTL = 7 * 24 * 3600.0
"""A token may not live longer than this (exp - iat)."""
MIN_KEY_BYTES = 32
"""HS256 keys shorter than the hash are refused (RFC 7518 §3.2)."""
DEFAULT_AUDIENCE = "quire"
PEER_TTL = 120.0
"""Lifetime of a token a coordinator derives for a peer hop (checked at the hop's Hello)."""
PEER_READ_TTL = 3600.0
"""Lifetime of a derived token for a proxied read or a replication pipeline, which are cut
when their token expires (Gazette's 1 h)."""


class TokenError(QuireError):
    """A token is missing, malformed, oversized, expired, not yet valid, or wrongly signed.
    The message says which, never the token."""


class Capability(enum.IntFlag):
    """Gazette's bits (auth.go), plus SHARDS for consumer shard RPCs."""

    LIST = 1 << 1
    APPLY = 1 << 2
    READ = 1 << 3
    APPEND = 1 << 4
    REPLICATE = 1 << 5
    SHARDS = 1 << 6


CAPABILITIES: dict[str, Capability] = {c.name.lower(): c for c in Capability}  # type: ignore[union-attr]


def cap_names(caps: Capability) -> list[str]:
    return [name for name, c in CAPABILITIES.items() if caps & c]


def parse_caps(value: str | Iterable[str]) -> Capability:
    """`"append,read"` (or a list of names, any case) → Capability flags."""
    names = value.split(",") if isinstance(value, str) else list(value)
    caps = Capability(0)
    for raw in names:
        if not isinstance(raw, str):
            raise ValidationError("cap", f"expected capability names, got {type(raw).__name__}")
        name = raw.strip().lower()
        if not name:
            continue
        if name not in CAPABILITIES:
            raise ValidationError("cap", f"unknown capability {raw!r} (expected one of "
                                         f"{', '.join(CAPABILITIES)})")
        caps |= CAPABILITIES[name]
    if not caps:
        raise ValidationError("cap", "at least one capability is required")
    return caps


# -- scope ------------------------------------------------------------------------------

def _check_prefix(p: object, path: str) -> str:
    if not isinstance(p, str):
        raise ValidationError(path, f"expected a string, got {type(p).__name__}")
    if p == "*":
        return p
    if p.endswith("/"):
        validate_path(p[:-1], path, 1, JOURNAL_NAME_MAX - 1)
        if any(part.startswith(".") for part in p.split("/")):
            raise ValidationError(path, f"{p!r}: a path segment may not begin with '.'")
        return p
    validate_journal_name(p, path)  # an exact journal name
    return p


class Scope(msgspec.Struct, frozen=True):
    """Which journals a token reaches: prefixes/exact names and/or a label selector."""

    prefixes: tuple[str, ...] = ()
    selector: LabelSelector | None = None

    @classmethod
    def of(cls, prefixes: Iterable[str] = (), selector: str | LabelSelector | None = None) -> Scope:
        pfx = tuple(_check_prefix(p, f"pfx[{i}]") for i, p in enumerate(prefixes))
        sel = parse_selector(selector) if isinstance(selector, str) and selector.strip() else (
            selector if isinstance(selector, LabelSelector) else None)
        if isinstance(selector, str) and not selector.strip():
            raise ValidationError("sel", "an empty selector would match every journal: use pfx ['*']")
        if not pfx and sel is None:
            raise ValidationError("pfx", "a token needs a prefix list or a label selector")
        return cls(pfx, sel)

    def covers_name(self, journal: str) -> bool:
        for p in self.prefixes:
            if p == "*" or p == journal or (p.endswith("/") and journal.startswith(p)):
                return True
        return False

    def covers(self, journal: str, labels: LabelSet | None) -> bool:
        try:  # only validated names match: `team-a/../team-b/x` is in no scope
            validate_journal_name(journal)
        except ValidationError:
            return False
        if self.prefixes and not self.covers_name(journal):
            return False
        if self.selector is not None:
            return self.selector.matches_journal(journal, labels or LabelSet())
        return True


class Claims(msgspec.Struct, frozen=True):
    subject: str
    caps: Capability
    scope: Scope
    issued_at: float
    expires_at: float

    def allows(self, cap: Capability, journal: str | None, labels: LabelSet | None = None) -> bool:
        if not self.caps & cap:
            return False
        return journal is None or self.scope.covers(journal, labels)


# -- keys -------------------------------------------------------------------------------

def decode_keys(text: str) -> list[bytes]:
    """Comma/newline-separated base64 (or base64url) keys → raw key bytes, in order."""
    keys: list[bytes] = []
    for i, item in enumerate(x.strip() for x in text.replace("\n", ",").split(",")):
        if not item:
            continue
        try:
            raw = base64.urlsafe_b64decode(item.replace("+", "-").replace("/", "_")
                                           + "=" * (-len(item) % 4))
        except (binascii.Error, ValueError):
            raise ValidationError(f"auth_keys[{i}]", "not base64") from None
        if len(raw) < MIN_KEY_BYTES:
            raise ValidationError(f"auth_keys[{i}]",
                                  f"{len(raw)} bytes; HS256 keys need at least {MIN_KEY_BYTES}")
        keys.append(raw)
    return keys


class Keyring:
    """Signing and verification keys. Never printed: repr shows only how many."""

    def __init__(self, keys: Sequence[bytes], audience: str = DEFAULT_AUDIENCE,
                 clock: Callable[[], float] = time.time) -> None:
        if not keys:
            raise ValidationError("auth_keys", "at least one key is required")
        for i, k in enumerate(keys):
            if len(k) < MIN_KEY_BYTES:
                raise ValidationError(f"auth_keys[{i}]", f"HS256 keys need at least {MIN_KEY_BYTES} bytes")
        self._keys = list(keys)
        self.audience = audience
        self.clock = clock

    @classmethod
    def from_text(cls, text: str, audience: str = DEFAULT_AUDIENCE) -> Keyring:
        return cls(decode_keys(text), audience)

    def __repr__(self) -> str:
        return f"Keyring({len(self._keys)} keys, audience={self.audience!r})"

    def task_keys(self) -> list[bytes]:
        """Keys for signing Celery task messages, derived from these (task_signing.py)."""
        from .task_signing import signing_keys

        return signing_keys(self._keys)

    # -- minting ---------------------------------------------------------------------

    def mint(self, caps: Capability, scope: Scope, ttl: float, subject: str,
             now: float | None = None) -> str:
        if ttl <= 0 or ttl > MAX_TTL:
            raise ValidationError("ttl", f"{ttl:g}s (expected 0 < ttl <= {MAX_TTL:g}s)")
        now = self.clock() if now is None else now
        claims: dict[str, Any] = {"sub": subject, "aud": self.audience, "iat": int(now),
                                  "nbf": int(now), "exp": int(now + ttl), "cap": cap_names(caps)}
        if scope.prefixes:
            claims["pfx"] = list(scope.prefixes)
        if scope.selector is not None:
            claims["sel"] = str(scope.selector)
        return jwt.encode(claims, self._keys[0], algorithm=ALGORITHM)

    def derive(self, subject: str, caps: Capability, journal: str, ttl: float = PEER_TTL) -> str:
        """A short-lived token scoped to exactly one journal, for a coordinator's hop to a
        peer (replicate, proxied append/read/fragments). A client token is never forwarded."""
        return self.mint(caps, Scope((journal,)), ttl, subject)

    # -- verification ----------------------------------------------------------------

    def verify(self, token: object) -> Claims:
        if not isinstance(token, str) or not token:
            raise TokenError("no token")
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenError(f"token of {len(token)} bytes exceeds {MAX_TOKEN_BYTES}")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise TokenError("malformed token") from None
        if header.get("alg") != ALGORITHM:
            raise TokenError(f"token algorithm {str(header.get('alg'))[:16]!r} is not {ALGORITHM}")
        payload: dict[str, Any] | None = None
        for key in self._keys:
            try:
                payload = jwt.decode(
                    token, key, algorithms=[ALGORITHM], audience=self.audience,
                    leeway=LEEWAY, options={"require": ["exp", "iat", "sub", "cap"]})
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.ExpiredSignatureError:
                raise TokenError("token expired") from None
            except jwt.ImmatureSignatureError:
                raise TokenError("token not yet valid") from None
            except jwt.InvalidAudienceError:
                raise TokenError("token is for another audience") from None
            except jwt.MissingRequiredClaimError as exc:
                raise TokenError(f"token lacks the {exc.claim!r} claim") from None
            except jwt.InvalidTokenError as exc:
                raise TokenError(f"invalid token: {type(exc).__name__}") from None
        if payload is None:
            raise TokenError("token signature matches no key")
        return _claims(payload, self.clock())


def _claims(p: dict[str, Any], now: float) -> Claims:
    iat, exp = p.get("iat"), p.get("exp")
    if not isinstance(iat, int | float) or not isinstance(exp, int | float):
        raise TokenError("iat and exp must be numbers")
    if iat > now + LEEWAY:
        raise TokenError("token issued in the future")
    if exp - iat > MAX_TTL:
        raise TokenError(f"token lifetime exceeds {MAX_TTL:g}s")
    sub = p.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 256:
        raise TokenError("sub must be a non-empty string")
    cap, pfx, sel = p.get("cap"), p.get("pfx", ()), p.get("sel")
    if not isinstance(cap, list):
        raise TokenError("cap must be a list of capability names")
    if not isinstance(pfx, list | tuple) or (sel is not None and not isinstance(sel, str)):
        raise TokenError("pfx must be a list and sel a string")
    try:
        caps = parse_caps(cap)
        scope = Scope.of(pfx, sel)
    except ValidationError as exc:
        raise TokenError(f"bad claims: {exc}") from None
    return Claims(subject=sub, caps=caps, scope=scope, issued_at=float(iat), expires_at=float(exp))


# -- the authorizer ---------------------------------------------------------------------

class Refusal(NamedTuple):
    capability: Capability
    journal: str | None

    @property
    def message(self) -> str:
        where = f"journal {self.journal}" if self.journal else "this cluster"
        return f"token lacks {self.capability.name} on {where}"  # type: ignore[union-attr]


RPC_CAPABILITY: dict[type, Capability] = {
    AppendRequest: Capability.APPEND,
    ReadRequest: Capability.READ,
    ListFragmentsRequest: Capability.READ,
    FetchFragmentRequest: Capability.READ,
    ReplicateProposal: Capability.REPLICATE,
    ListRequest: Capability.LIST,
    ListBrokersRequest: Capability.LIST,
    ApplyRequest: Capability.APPLY,
}
"""Every RPC's capability (docs/security.md prints this table; tests check both agree).
List is filtered by scope; Apply is checked per change against the current and new spec."""


def requirement(msg: object) -> tuple[Capability, str | None]:
    """The capability an RPC needs and the journal it touches (None: not one journal)."""
    cap = RPC_CAPABILITY.get(type(msg))
    if cap is None:
        raise ValidationError("rpc", f"{type(msg).__name__} is not an RPC")
    if isinstance(msg, AppendRequest | ReadRequest | ListFragmentsRequest):
        return cap, msg.journal
    if isinstance(msg, FetchFragmentRequest):
        return cap, msg.fragment.journal
    if isinstance(msg, ReplicateProposal):
        return cap, msg.proposal.journal
    return cap, None


def authorize(claims: Claims, msg: object,
              labels_of: Callable[[str], LabelSet | None] = lambda _: None) -> Refusal | None:
    """None if `claims` may make this request; else what is missing. Apply's per-change
    checks need the current specs: see `authorize_apply`."""
    cap, journal = requirement(msg)
    if not claims.allows(cap, journal, labels_of(journal) if journal else None):
        return Refusal(cap, journal)
    return None


def authorize_apply(claims: Claims, changes: Iterable[tuple[str, JournalSpec | None,
                                                            JournalSpec | None]]) -> Refusal | None:
    """Each (name, current spec or None, new spec or None for a delete) must be in scope
    both as it is and as it would be: a journal cannot be moved out of (or into) a scope
    its editor does not hold."""
    if not claims.caps & Capability.APPLY:
        return Refusal(Capability.APPLY, None)
    for name, current, new in changes:
        # A spec that does not exist (a create, or a delete of nothing) is checked by name.
        specs = [s for s in (current, new) if s is not None] or [None]
        for spec in specs:
            if not claims.scope.covers(name, spec.labels if spec is not None else None):
                return Refusal(Capability.APPLY, name)
    return None
