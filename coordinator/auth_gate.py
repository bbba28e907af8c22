"""The coordinator's auth layer: one gate at the RPC entry (DESIGN.md §14).

`Gate.admit` verifies the token a connection's Hello carries — before the connection
may send anything else — and returns that connection's `ConnAuth`. `ConnAuth.check`
maps each request to its capability and journal (protocol.auth.requirement, the one
table) and refuses what the token does not allow: handlers never check anything
themselves. List is filtered by scope and Apply is authorized per change against the
current and the new spec (server.py hands those over).

Off (every connection admitted with no claims) when no keys are configured. Refusals
are counted in `quire_auth_refusals_total` and logged once per connection with the
token's subject — never the token.

Peers: `PeerTokens` derives the short-lived, one-journal tokens this coordinator
presents when it replicates or proxies (a client's token is never forwarded).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from ssl import SSLContext

from protocol import (
    AppendResponse,
    ApplyResponse,
    FetchFragmentResponse,
    LabelSet,
    ListBrokersResponse,
    ListFragmentsResponse,
    ListResponse,
    ReadResponse,
    ReplicateResponse,
    Status,
)
from protocol.auth import (
    LEEWAY,
    PEER_READ_TTL,
    PEER_TTL,
    Capability,
    Claims,
    Keyring,
    Refusal,
    TokenError,
    authorize,
)
from protocol.logs import get_logger
from protocol.messages import (
    AppendRequest,
    ApplyRequest,
    FetchFragmentRequest,
    ListBrokersRequest,
    ListFragmentsRequest,
    ListRequest,
    Message,
    ReadRequest,
    ReplicateProposal,
)

from . import metrics

log = get_logger(__name__)

REFUSAL_RESPONSE: dict[type, type[Message]] = {
    AppendRequest: AppendResponse,
    ReadRequest: ReadResponse,
    ListFragmentsRequest: ListFragmentsResponse,
    FetchFragmentRequest: FetchFragmentResponse,
    ReplicateProposal: ReplicateResponse,
    ListRequest: ListResponse,
    ListBrokersRequest: ListBrokersResponse,
    ApplyRequest: ApplyResponse,
}
"""The response a refused request gets, with status FORBIDDEN."""

KEEPS_CONNECTION = (ReadRequest, ListFragmentsRequest, FetchFragmentRequest, ListRequest,
                    ListBrokersRequest, ApplyRequest)
"""After refusing these the connection stays in step; an append's chunks or a replicate
stream's frames would follow unread, so those connections close."""


def _count(reason: str, cap: str) -> None:
    metrics.AUTH_REFUSALS.labels(reason, cap).inc()


class ConnAuth:
    """What one connection's token allows (claims None: auth is off)."""

    __slots__ = ("claims", "peer", "_logged")

    def __init__(self, claims: Claims | None, peer: str) -> None:
        self.claims = claims
        self.peer = peer
        self._logged = False

    @property
    def on(self) -> bool:
        return self.claims is not None

    def remaining(self) -> float | None:
        """Seconds until the token expires (with the clock-skew leeway); None: auth off."""
        if self.claims is None:
            return None
        return self.claims.expires_at + LEEWAY - time.time()

    @property
    def subject(self) -> str:
        return self.claims.subject if self.claims is not None else ""

    def check(self, msg: object, labels_of: Callable[[str], LabelSet | None]) -> Refusal | None:
        if self.claims is None:
            return None
        refusal = authorize(self.claims, msg, labels_of)
        if refusal is not None:
            self.refused(refusal, type(msg).__name__)
        return refusal

    def refused(self, refusal: Refusal, rpc: str) -> None:
        _count("forbidden", refusal.capability.name or "")
        if not self._logged:  # once per connection: a refused client may retry in a loop
            self._logged = True
            log.warning("request refused", subject=self.subject, peer=self.peer, rpc=rpc,
                        capability=refusal.capability.name, journal=refusal.journal)

    def visible(self, journal: str, labels: LabelSet) -> bool:
        """Whether List shows this journal to the connection."""
        return self.claims is None or self.claims.scope.covers(journal, labels)


def refusal_response(msg: object, refusal: Refusal) -> tuple[Message, bool]:
    """The FORBIDDEN answer to `msg` and whether the connection may carry another RPC."""
    cls = REFUSAL_RESPONSE[type(msg)]
    return (cls(status=Status.FORBIDDEN, message=refusal.message),  # type: ignore[call-arg]
            isinstance(msg, KEEPS_CONNECTION))


class Gate:
    def __init__(self, keyring: Keyring | None) -> None:
        self.keyring = keyring

    @property
    def on(self) -> bool:
        return self.keyring is not None

    def admit(self, token: str, peer: str) -> ConnAuth:
        """The connection's auth, or TokenError (the caller answers UNAUTHORIZED)."""
        if self.keyring is None:
            return ConnAuth(None, peer)
        try:
            return ConnAuth(self.keyring.verify(token), peer)
        except TokenError as exc:
            _count("unauthorized", "")
            log.warning("connection refused: bad token", peer=peer, reason=str(exc))
            raise


class PeerTokens:
    """Derived tokens for this coordinator's hops to its peers, cached for half their
    lifetime (a pipeline or proxy connection presents one at its Hello)."""

    def __init__(self, keyring: Keyring | None, subject: str, ssl: SSLContext | None = None) -> None:
        self.keyring = keyring
        self.subject = subject
        self.ssl = ssl
        self._cache: dict[tuple[Capability, str], tuple[str, float]] = {}

    def token(self, cap: Capability, journal: str) -> str:
        if self.keyring is None:
            return ""
        now = time.monotonic()
        hit = self._cache.get((cap, journal))
        if hit is not None and hit[1] > now:
            return hit[0]
        if len(self._cache) > 4096:
            self._cache.clear()
        # A proxied read and a replication pipeline live long and are cut when their
        # token expires: they get a longer-lived token (Gazette's 1 h); every other hop
        # is short, checked at Hello.
        ttl = PEER_READ_TTL if cap in (Capability.READ, Capability.REPLICATE) else PEER_TTL
        tok = self.keyring.derive(self.subject, cap, journal, ttl)
        self._cache[(cap, journal)] = (tok, now + ttl / 2)
        return tok
