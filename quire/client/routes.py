"""Which endpoint to ask about a journal (Gazette's broker/client/route_cache.go).

Appends go to the cached primary and reads to a cached member; with no cached route
(or after the cache was invalidated) a call goes to one of the seed endpoints, which
proxies, and the route in the response header refills the cache. Seeds are tried in a
rotating order so one dead seed does not take every call down with it.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict

import msgspec

from protocol import Header, Route


class RouteCache:
    def __init__(self, seeds: list[str], *, max_entries: int = 65536, ttl: float = 300.0,
                 rewrite: dict[str, str] | None = None) -> None:
        # rewrite: endpoint -> the endpoint to use instead, applied to every learned route
        # (`quire chaos` sends each coordinator's traffic through its client proxy).
        # max_entries: a client writing round-robin over more journals than it caches
        # misses every time, and each miss is an append proxied by a seed (#49: 10,000
        # journals ran at 0.09x the rate over 10 with 4,096). An entry is ~200 bytes.
        if not seeds:
            raise ValueError("a client needs at least one endpoint")
        self.seeds = list(dict.fromkeys(seeds))
        self.max_entries = max_entries
        self.ttl = ttl
        self._routes: OrderedDict[str, tuple[Route, float, str | None, int]] = OrderedDict()
        """journal -> (route, when it was last confirmed, its primary's endpoint, the etcd
        revision of the header it came from)."""
        self._rr = itertools.count()
        self._down: dict[str, float] = {}
        self.rewrite = rewrite

    def get(self, journal: str) -> Route | None:
        entry = self._routes.get(journal)
        if entry is None:
            return None
        route, at = entry[0], entry[1]
        # Routes change only when the allocator moves a journal, but an old entry can
        # outlive every member it names; a TTL bounds how long we trust it.
        if time.monotonic() - at > self.ttl:
            del self._routes[journal]
            return None
        return route

    def update(self, journal: str, header: Header | None) -> None:
        if header is None or not header.route.members or not header.route.endpoints:
            return
        route, now = header.route, time.monotonic()
        if self.rewrite is not None:
            rewrite = self.rewrite
            route = msgspec.structs.replace(
                route, endpoints=tuple([rewrite.get(e, e) for e in route.endpoints]))
        entry = self._routes.get(journal)
        revision = header.etcd.revision
        if entry is not None and now - entry[1] < self.ttl / 2 and entry[3] == revision \
                and entry[0] == route:
            return  # confirmed recently: an append's answer needs no bookkeeping
        self._routes[journal] = (route, now, route.primary_endpoint, revision)
        self._routes.move_to_end(journal)
        while len(self._routes) > self.max_entries:
            self._routes.popitem(last=False)

    def revision(self, journal: str) -> int:
        """The etcd revision of the header the journal's cached route came from, while
        confirmed within half its TTL (else 0): an append names it, and an OK answer
        of that revision comes without a header (AppendRequest.route_revision). Past
        half the TTL an append asks for the header again, whose answer renews it."""
        entry = self._routes.get(journal)
        if entry is None or time.monotonic() - entry[1] >= self.ttl / 2:
            return 0
        return entry[3]

    def primary(self, journal: str) -> str | None:
        """The cached primary endpoint of a journal (however old), or None."""
        entry = self._routes.get(journal)
        return entry[2] if entry is not None else None

    def observe(self, journal: str, header: Header) -> str | None:
        """A route another coordinator reported while an append waited (reroute.py):
        cached unless older than the cached one. Returns the journal's primary endpoint
        as now cached (None: no primary, or nothing learned)."""
        entry = self._routes.get(journal)
        if entry is not None and header.etcd.revision < entry[3]:
            return None  # that coordinator is behind us: it tells nothing new
        self.update(journal, header)
        return self.primary(journal)

    def invalidate(self, journal: str) -> None:
        self._routes.pop(journal, None)

    def mark_down(self, endpoint: str) -> None:
        """An endpoint refused us; prefer others for a few seconds."""
        self._down[endpoint] = time.monotonic()
        for journal in [j for j, entry in self._routes.items() if endpoint in entry[0].endpoints]:
            del self._routes[journal]

    def is_down(self, endpoint: str) -> bool:
        """Marked down (it failed us) within the last few seconds."""
        return self._is_down(endpoint)

    def _is_down(self, endpoint: str) -> bool:
        at = self._down.get(endpoint)
        if at is None:
            return False
        if time.monotonic() - at > 5.0:
            del self._down[endpoint]
            return False
        return True

    def seed(self) -> str:
        """The next seed endpoint, skipping recently failed ones while others remain."""
        n = len(self.seeds)
        start = next(self._rr)
        for i in range(n):
            candidate = self.seeds[(start + i) % n]
            if not self._is_down(candidate):
                return candidate
        return self.seeds[start % n]

    def for_append(self, journal: str) -> str:
        entry = self._routes.get(journal)
        if entry is not None:  # the common case, without building anything
            primary = entry[2]
            if primary and time.monotonic() - entry[1] <= self.ttl \
                    and (not self._down or not self._is_down(primary)):
                return primary
        route = self.get(journal)
        if route is not None and route.primary_endpoint and not self._is_down(route.primary_endpoint):
            return route.primary_endpoint
        return self.seed()

    def append_target(self, journal: str, now: float) -> tuple[str, str | None, int]:
        """(for_append, primary, revision) of `journal` at monotonic time `now`, in one
        lookup: the append path asks all three for each append, and three lookups cost it
        six Python-level calls more than one (bench/calls.py)."""
        entry = self._routes.get(journal)
        if entry is not None:
            primary, age = entry[2], now - entry[1]
            if primary and age <= self.ttl and (not self._down or not self._is_down(primary)):
                return primary, primary, entry[3] if age < self.ttl / 2 else 0
        return self.for_append(journal), self.primary(journal), self.revision(journal)

    def for_read(self, journal: str) -> str:
        route = self.get(journal)
        if route is not None:
            # The primary has every committed byte first; any member will do, but
            # reading where appends land avoids a replica lagging a commit behind.
            primary = route.primary_endpoint
            if primary and not self._is_down(primary):
                return primary
            for endpoint in route.endpoints:
                if endpoint and not self._is_down(endpoint):
                    return endpoint
        return self.seed()
