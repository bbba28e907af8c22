"""Read-only view of the etcd topology the workers need.

Workers never import `coordinator/`: they read the three prefixes they care about
(`journals/`, `members/`, `assign/`) straight from etcd with aetcd, one snapshot
per call, with a timeout on every request. Values are JSON (msgspec), as written
by the topology role (docs/architecture.md, "etcd keys").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aetcd
import msgspec
from aetcd import rpc

from protocol.logs import get_logger
from protocol import JournalSpec
from topology.etcd import TopologyError, client_for, prefix_end
from workers.errors import TopologyUnavailable

__all__ = ["SPEC_TXN", "Topology", "JournalTopology", "read_journal", "read_specs", "read_specs_sync",
           "read_topology"]

log = get_logger(__name__)
T = TypeVar("T")

_SPEC = msgspec.json.Decoder(JournalSpec)


class _Member(msgspec.Struct, kw_only=True):
    endpoint: str = ""


_MEMBER = msgspec.json.Decoder(_Member)


class JournalTopology(msgspec.Struct, frozen=True, kw_only=True):
    spec: JournalSpec
    endpoints: tuple[str, ...] = ()
    """Endpoints of the journal's assigned members, the primary (slot 0) first."""

    @property
    def primary_endpoint(self) -> str | None:
        return self.endpoints[0] if self.endpoints else None


class Topology(msgspec.Struct, frozen=True, kw_only=True):
    journals: dict[str, JournalTopology] = {}


def _parse_assign_key(rest: str) -> tuple[str, str, int] | None:
    """`<journal>#<zone>#<suffix>#<slot>` -> (journal, "zone#suffix", slot)."""
    parts = rest.rsplit("#", 3)
    if len(parts) != 4 or not parts[3].isdigit():
        return None
    return parts[0], f"{parts[1]}#{parts[2]}", int(parts[3])


async def _with_client(etcd_url: str, timeout: float, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
    try:
        client = client_for(etcd_url, timeout=max(1, int(timeout)))
    except TopologyError as exc:
        raise TopologyUnavailable(str(exc)) from None
    try:
        return await asyncio.wait_for(fn(client), timeout)
    except (asyncio.TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
        raise TopologyUnavailable(f"etcd at {etcd_url}: {type(exc).__name__}: {exc}") from exc
    finally:
        try:
            await asyncio.wait_for(client.close(), 2.0)
        except Exception:  # noqa: BLE001 - closing a broken channel
            pass


async def _prefix(client: aetcd.Client, prefix: str) -> list[tuple[str, bytes]]:
    result = await client.get_prefix(prefix.encode())
    return [(kv.key.decode()[len(prefix):], kv.value) for kv in result]


_SPECS: dict[tuple[str, str], tuple[tuple[int, int], Topology]] = {}
"""Per (etcd URL, root): the last read of every spec alone and the version it had."""


async def _specs_version(client: aetcd.Client, prefix: str, timeout: float) -> tuple[int, int]:
    """(keys under `prefix`, the newest mod revision among them): a put under the
    prefix raises the second, a delete lowers the first — one key read, not all."""
    key = prefix.encode()
    if client.kvstub is None:
        await client.connect()  # (aetcd's own calls connect on first use; a stub call does not)
    resp = await client.kvstub.Range(
        rpc.RangeRequest(key=key, range_end=prefix_end(key), limit=1, keys_only=True,
                         sort_order=rpc.RangeRequest.DESCEND,
                         sort_target=rpc.RangeRequest.MOD),
        timeout=timeout, metadata=client.metadata)
    return int(resp.count), (int(resp.kvs[0].mod_revision) if resp.kvs else 0)


async def read_topology(etcd_url: str, root: str, *, timeout: float = 10.0,
                        journal: str | None = None, endpoints: bool = True) -> Topology:
    """Specs of every journal (or just `journal`), with member endpoints attached
    (`endpoints` False: neither members nor assignments are read; no endpoints).

    Every spec alone (no `journal`, no `endpoints`: the index sweep's read, every
    QUIRE_WORKER_INDEX_SWEEP_INTERVAL) is read again only when the specs changed since
    this process last read them (`_specs_version`): 10,000 specs cost a Range of one
    key, not 10,000 decoded (the Topology returned is shared: never mutate it)."""

    async def nothing() -> list[tuple[str, bytes]]:
        return []

    async def run(client: aetcd.Client) -> Topology:
        jprefix = f"{root}/journals/" + (journal or "")
        aprefix = f"{root}/assign/" + (f"{journal}#" if journal else "")
        cached = journal is None and not endpoints
        if cached:
            version = await _specs_version(client, jprefix, timeout)
            last = _SPECS.get((etcd_url, root))
            if last is not None and last[0] == version:
                return last[1]
        specs, members, assigns = await asyncio.gather(
            _prefix(client, jprefix),
            _prefix(client, f"{root}/members/") if endpoints else nothing(),
            _prefix(client, aprefix) if endpoints else nothing())
        endpoint_of: dict[str, str] = {}
        for key, raw in members:
            try:
                endpoint_of[key] = _MEMBER.decode(raw).endpoint
            except msgspec.DecodeError:
                log.warning("skipping a malformed member", key=key)
        slots: dict[str, list[tuple[int, str]]] = {}
        for key, _ in assigns:
            parsed = _parse_assign_key(f"{journal}#{key}" if journal else key)
            if parsed is None:
                continue
            name, member, slot = parsed
            ep = endpoint_of.get(member)
            if ep:
                slots.setdefault(name, []).append((slot, ep))
        out: dict[str, JournalTopology] = {}
        for key, raw in specs:
            name = (journal or "") + key
            if journal and key:
                continue  # a longer name sharing our prefix
            try:
                spec = _SPEC.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("skipping a malformed journal spec", journal=name, error=str(exc))
                continue
            eps = tuple(dict.fromkeys(ep for _, ep in sorted(slots.get(spec.name, ()))))
            out[spec.name] = JournalTopology(spec=spec, endpoints=eps)
        topo = Topology(journals=out)
        if cached:
            # (a put between the version read and the specs read makes the next sweep
            # read them again: the version stored is the older one)
            _SPECS[(etcd_url, root)] = (version, topo)
        return topo

    return await _with_client(etcd_url, timeout, run)


async def read_journal(etcd_url: str, root: str, journal: str, *,
                       timeout: float = 10.0) -> JournalTopology | None:
    topo = await read_topology(etcd_url, root, timeout=timeout, journal=journal)
    return topo.journals.get(journal)


SPEC_TXN = 100
"""Spec reads per etcd transaction (etcd allows 128 operations in one)."""


async def read_specs(etcd_url: str, root: str, journals: list[str], *,
                     timeout: float = 10.0) -> Topology:
    """The specs of `journals` only, without endpoints (an absent one: not in the
    result): a get per journal, SPEC_TXN to a transaction. What an index
    `refresh_batch` needs — not every spec, member and assignment of the cluster (40,000
    keys at 10,000 journals) per batch of 200 (#49)."""

    async def run(client: aetcd.Client) -> Topology:
        out: dict[str, JournalTopology] = {}
        for i in range(0, len(journals), SPEC_TXN):
            chunk = journals[i:i + SPEC_TXN]
            _, responses = await client.transaction(compare=[], failure=[], success=[
                client.transactions.get(f"{root}/journals/{name}".encode()) for name in chunk])
            for name, kvs in zip(chunk, responses, strict=True):
                for raw, _meta in kvs:
                    try:
                        spec = _SPEC.decode(raw)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        log.warning("skipping a malformed journal spec", journal=name,
                                    error=str(exc))
                        continue
                    out[spec.name] = JournalTopology(spec=spec)
        return Topology(journals=out)

    return await _with_client(etcd_url, timeout, run)


def read_specs_sync(etcd_url: str, root: str, journals: list[str], *,
                    timeout: float = 10.0) -> Topology:
    """`read_specs` for Celery tasks (sync code): one event loop per call."""
    return asyncio.run(read_specs(etcd_url, root, journals, timeout=timeout))


def read_topology_sync(etcd_url: str, root: str, *, timeout: float = 10.0,
                       journal: str | None = None, endpoints: bool = True) -> Topology:
    """For Celery tasks (sync code): one event loop per call."""
    return asyncio.run(read_topology(etcd_url, root, timeout=timeout, journal=journal,
                                     endpoints=endpoints))


def read_value_sync(etcd_url: str, key: str, *, timeout: float = 10.0) -> bytes | None:
    """One key's value (None if absent), for Celery tasks."""

    async def run(client: aetcd.Client) -> bytes | None:
        kv = await client.get(key.encode())
        return None if kv is None else kv.value

    return asyncio.run(_with_client(etcd_url, timeout, run))
