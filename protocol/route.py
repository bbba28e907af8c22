"""Routes and headers: who serves a journal, as of which etcd revision."""

from __future__ import annotations

import msgspec

from .names import validate_suffix, validate_zone


class ProcessId(msgspec.Struct, frozen=True, order=True):
    zone: str
    suffix: str

    def validate(self, path: str = "process_id") -> None:
        validate_zone(self.zone, f"{path}.zone")
        validate_suffix(self.suffix, f"{path}.suffix")

    def __str__(self) -> str:
        return f"{self.zone}#{self.suffix}"

    @classmethod
    def parse(cls, text: str) -> ProcessId:
        zone, _, suffix = text.partition("#")
        pid = cls(zone, suffix)
        pid.validate()
        return pid


class Route(msgspec.Struct, frozen=True, kw_only=True):
    members: tuple[ProcessId, ...] = ()
    """Sorted by (zone, suffix)."""
    primary: int = -1
    """Index into members, or -1 when there is no primary."""
    endpoints: tuple[str, ...] = ()
    """`host:port` of each member, parallel to members (may be empty in stored routes)."""

    @property
    def primary_id(self) -> ProcessId | None:
        return self.members[self.primary] if self.primary >= 0 else None

    @property
    def primary_endpoint(self) -> str | None:
        if self.primary < 0 or self.primary >= len(self.endpoints):
            return None
        return self.endpoints[self.primary]

    def index_of(self, pid: ProcessId) -> int:
        try:
            return self.members.index(pid)
        except ValueError:
            return -1

    def peers(self, me: ProcessId) -> list[tuple[ProcessId, str]]:
        """Members other than `me`, with their endpoints."""
        return [(m, e) for m, e in zip(self.members, self.endpoints) if m != me]

    def equivalent(self, other: Route) -> bool:
        """Same members and primary (endpoints are attached locally and do not count)."""
        return self.members == other.members and self.primary == other.primary

    def without_endpoints(self) -> Route:
        return Route(members=self.members, primary=self.primary)

    def __str__(self) -> str:
        return "[" + ", ".join(
            ("*" if i == self.primary else "") + str(m) for i, m in enumerate(self.members)) + "]"


class Etcd(msgspec.Struct, frozen=True, kw_only=True):
    cluster_id: int = 0
    member_id: int = 0
    revision: int = 0
    raft_term: int = 0


class Header(msgspec.Struct, frozen=True, kw_only=True):
    process_id: ProcessId | None = None
    """The broker that produced (or is being asked in) this message."""
    route: Route = Route()
    etcd: Etcd = Etcd()
