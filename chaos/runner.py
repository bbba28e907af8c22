"""One chaos run, start to finish.

    proxies up -> cluster up (etcd, redis, S3, a Celery worker, N coordinators in
    several zones) -> journals applied -> writers + nemesis for `duration` seconds
    -> heal everything -> read every journal back -> checker -> report

Links: every coordinator i listens on its real port; clients reach it only through
`client[i]` (the writers' client rewrites every route it learns to those proxies), and
when the server supports `--advertise` it announces `peer[i]`, so replication and
proxied appends from its peers cross a second proxy that the nemesis faults apart.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from protocol import Codec, FragmentSpec, JournalSpec
from quire.client import Client
from tools.services import free_port

from .bounded import Stalls
from .checker import Report
from .cluster import LocalCluster, supports_advertise
from .consumer_group import ConsumerGroup, GroupConfig
from .ending import after_writes, clean_up, record_crashes, record_stalls, wait_routed
from .history import History
from .nemesis import Links, Nemesis
from .proxy import FaultProxy
from .local_faults import LocalFaults
from .schedule import (
    CONSUMER_KINDS,
    DEFAULT_KINDS,
    DISK_KINDS,
    FaultKind,
    ScheduleConfig,
    build_schedule,
)
from .writers import classify, proxied_routes, tail, trace_attempt, writer

__all__ = ["ChaosConfig", "classify", "run_chaos"]

log = structlog.get_logger("chaos.runner")

CODECS = (Codec.NONE, Codec.GZIP, Codec.ZSTANDARD, Codec.SNAPPY)



@dataclass
class ChaosConfig:
    duration: float = 60.0
    seed: int = 0
    coordinators: int = 5
    zones: tuple[str, ...] = ("zone-a", "zone-b", "zone-c")
    journals: int = 8
    replication: int = 3
    writers: int = 8
    rate: float = 250.0
    """Appends per second, all writers together."""
    record_bytes: tuple[int, int] = (100, 1000)
    lease_ttl: int = 5
    fragment_length: int = 64 << 10
    kinds: tuple[FaultKind, ...] = (DEFAULT_KINDS + (FaultKind.KILL_WORKER,) + CONSUMER_KINDS
                                    + DISK_KINDS)
    """The deck. The disk and clock kinds need root (mounts); without it they are dropped."""
    append_timeout: float = 20.0
    history_path: str | None = None
    workdir: str | None = None
    identified: bool = True
    """Exactly-once writers (docs/exactly-once.md): every append carries a transaction
    id (a producer per writer, a history per journal) and is re-sent after an unknown
    outcome until answered; the checker's `duplicates` must still be 0."""
    consumers: bool = True
    """Run a consumer group (chaos/consumer_group.py) and check its counts; without it
    the consumer fault kinds are dropped."""
    consumer_members: int = 3
    consumer_shards: int = 4
    consumer_rate: float = 20.0
    """Event appends per second to the consumers' sources (10 JSON lines each)."""
    hosts: int = 0
    """>0: every process on a simulated host (chaos/host_cluster.py), this many
    coordinator hosts, a three-member etcd, faults at the network layer
    (chaos/net_faults.py) instead of proxies."""


@dataclass
class _Run:
    cfg: ChaosConfig
    history: History
    links: Links = field(default_factory=Links)
    cluster: Any = None
    """A LocalCluster, or a HostCluster with --hosts."""
    journals: list[str] = field(default_factory=list)
    store_url: str = ""
    store_options: dict[str, Any] = field(default_factory=dict)
    advertise: bool = False
    resent: int = 0
    """Identified appends re-sent after an unknown outcome (the broker dedups them)."""
    local: LocalFaults | None = None
    """The coordinators' faulty disks, when a disk or clock kind is dealt."""
    stalls: Stalls = field(default_factory=Stalls)
    """Waits of the harness that did not finish within their bound (chaos/bounded.py)."""


async def _route(admin: Client, journal: str) -> tuple[str | None, list[str]]:
    entry = await asyncio.wait_for(admin.get_journal(journal), 10.0)
    route = entry.route
    primary = str(route.primary_id) if route.primary_id is not None else None
    return primary, [str(m) for m in route.members if str(m) != primary]


async def _setup(run: _Run) -> Client:
    cfg = run.cfg
    if cfg.hosts:
        from .host_cluster import HostCluster

        run.cluster = HostCluster(cfg.hosts, consumers=cfg.consumer_members if cfg.consumers
                                  else 0, env={"QUIRE_LEASE_TTL_SECONDS": str(cfg.lease_ttl)},
                                  workdir=cfg.workdir)
        await asyncio.to_thread(run.cluster.start)
        return await _journals(run)
    ports = {i: free_port() for i in range(cfg.coordinators)}
    for i, port in ports.items():
        run.links.client.append(await FaultProxy(f"client->c{i}", f"127.0.0.1:{port}",
                                                 seed=cfg.seed + i).start())
    run.advertise = await asyncio.to_thread(supports_advertise)
    advertise: dict[int, str] = {}
    if run.advertise:
        for i, port in ports.items():
            proxy = await FaultProxy(f"peer->c{i}", f"127.0.0.1:{port}", seed=cfg.seed + 100 + i).start()
            run.links.peer.append(proxy)
            advertise[i] = proxy.endpoint
    if any(k in DISK_KINDS for k in cfg.kinds):
        run.local = LocalFaults()
    run.cluster = LocalCluster(
        cfg.coordinators, zones=cfg.zones, redis=True, s3=True, worker=True,
        env={"QUIRE_LEASE_TTL_SECONDS": str(cfg.lease_ttl)}, workdir=cfg.workdir,
        advertise=advertise, ports=ports,
        prepare=run.local.prepare if run.local is not None else None)
    await asyncio.to_thread(run.cluster.start)
    return await _journals(run)


async def _journals(run: _Run) -> Client:
    """The bucket, the store's environment, the admin client and the run's journals."""
    cfg = run.cfg
    s3 = run.cluster.s3
    assert s3 is not None
    await asyncio.to_thread(s3.create_bucket, "chaos")
    # The client reads persisted fragments straight from the store when a coordinator
    # hands it a fragment URL; it finds the endpoint and keys in the environment.
    os.environ.update(s3.client_env())
    run.store_url = "s3://chaos/run/"
    run.store_options = {"endpoint": s3.url, "access_key": s3.access_key,
                         "secret_key": s3.secret_key, "region": s3.region, "secure": False}
    admin = Client(run.cluster.endpoints, retry_timeout=20.0)
    run.journals = [f"chaos/j-{i:03d}" for i in range(cfg.journals)]
    specs = [JournalSpec(name=name, replication=cfg.replication, fragment=FragmentSpec(
        length=cfg.fragment_length, compression_codec=CODECS[i % len(CODECS)],
        stores=(run.store_url,), refresh_interval=5.0)) for i, name in enumerate(run.journals)]
    await admin.apply(specs)
    if not await wait_routed(admin, run, 90.0):
        raise RuntimeError("journals did not get a full route within 90 s")
    return admin


def _group(cfg: ChaosConfig) -> ConsumerGroup:
    return ConsumerGroup(GroupConfig(members=cfg.consumer_members, shards=cfg.consumer_shards,
                                     rate=cfg.consumer_rate, ttl=float(cfg.lease_ttl)),
                         seed=cfg.seed, replication=cfg.replication, zones=cfg.zones)


async def _start_group(run: _Run, admin: Client, group: ConsumerGroup) -> None:
    """The consumer group over its own source journals; members reach the coordinators
    through the client proxies, like the writers."""
    cluster = run.cluster
    assert cluster is not None and cluster.etcd is not None
    await group.start(admin, etcd_url=cluster.etcd.url, root=cluster.root,
                      store_url=run.store_url, brokers=_client_endpoints(run),
                      env=cluster.service_env(), workdir=cluster.workdir,
                      hosts=getattr(cluster, "consumer_hosts", None))


def _client_endpoints(run: _Run) -> list[str]:
    """Where clients connect: the client proxies, or on hosts the coordinators' own."""
    if run.links.client:
        return [p.endpoint for p in run.links.client]
    assert run.cluster is not None
    return list(run.cluster.endpoints)


def _mapping(run: _Run) -> dict[str, str]:
    """Every endpoint a route may name (real or advertised) -> that coordinator's client proxy."""
    assert run.cluster is not None
    out: dict[str, str] = {}
    if not run.links.client:
        return out  # on hosts: routes name real addresses, reached directly
    for i, c in enumerate(run.cluster.coordinators):
        out[c.endpoint] = run.links.client[i].endpoint
        if run.links.peer:
            out[run.links.peer[i].endpoint] = run.links.client[i].endpoint
    return out


async def run_chaos(cfg: ChaosConfig) -> tuple[Report, dict[str, Any]]:
    """Run and check; returns the report and the run's metadata (schedule, config...)."""
    run = _Run(cfg, History(cfg.history_path))
    if not cfg.consumers:
        cfg.kinds = tuple(k for k in cfg.kinds if k not in CONSUMER_KINDS)
    if os.geteuid() != 0 and any(k in DISK_KINDS for k in cfg.kinds):
        log.warning("runner.disk_kinds_dropped", reason="mounting faulty disks needs root")
        cfg.kinds = tuple(k for k in cfg.kinds if k not in DISK_KINDS)
    schedule = build_schedule(ScheduleConfig(
        duration=cfg.duration, seed=cfg.seed, journals=cfg.journals,
        coordinators=cfg.coordinators, lease_ttl=cfg.lease_ttl, kinds=cfg.kinds,
        shards=cfg.consumer_shards, consumer_ttl=cfg.lease_ttl))
    meta: dict[str, Any] = {"config": {k: v for k, v in asdict(cfg).items()},
                            "schedule": [e.to_json() for e in schedule],
                            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                        "platform": platform.platform()}}
    meta["config"]["kinds"] = [k.value for k in cfg.kinds]
    admin: Client | None = None
    writer_client: Client | None = None
    group: ConsumerGroup | None = None
    watching: asyncio.Future[None] | None = None
    report: Report | None = None
    try:
        admin = await _setup(run)
        assert run.cluster is not None
        meta["workdir"] = str(run.cluster.workdir)  # logs, spools, etcd: kept as evidence
        meta["peer_links_proxied"] = run.advertise
        if cfg.consumers:
            group = _group(cfg)
            await _start_group(run, admin, group)
        # On hosts a cut link is silent (no RST): an append sent to an isolated primary
        # waits on TCP retransmissions. The client abandons it once another coordinator
        # names a new primary (quire/client/reroute.py) and re-sends it there
        # (identified: deduplicated); lease TTL + 1 s per attempt stays as a backstop.
        writer_client = Client(_client_endpoints(run), retry_timeout=10.0,
                               rpc_timeout=cfg.lease_ttl + 1.0 if cfg.hosts else 60.0)
        writer_client.on_attempt = trace_attempt
        if run.links.client:
            writer_client.routes = proxied_routes(writer_client.endpoints, _mapping(run))

        async def lookup(journal: str) -> tuple[str | None, list[str]]:
            assert admin is not None
            return await _route(admin, journal)

        if cfg.hosts:
            from .net_faults import HostNemesis

            meta["hosts"] = run.cluster.layout
            nemesis: Nemesis = HostNemesis(run.cluster, run.links, run.history, run.journals,
                                           lookup, group)
        else:
            nemesis = Nemesis(run.cluster, run.links, run.history, run.journals, lookup, group)
        nemesis.local = run.local
        stop = asyncio.Event()
        run.history.t0 = time.monotonic()
        started = time.monotonic()
        writers = [asyncio.ensure_future(writer(i, writer_client, run, stop))
                   for i in range(cfg.writers)]
        if group is not None:
            writers += [asyncio.ensure_future(group.write(i, writer_client, stop))
                        for i in range(group.cfg.shards)]
            watching = asyncio.ensure_future(group.watch_primaries())
        # Two tracks (chaos/schedule.py): broker faults, and consumer faults beside them.
        nem = asyncio.ensure_future(asyncio.gather(
            nemesis.run([e for e in schedule if e.kind not in CONSUMER_KINDS], stop),
            nemesis.run([e for e in schedule if e.kind in CONSUMER_KINDS], stop)))
        tail_client = Client(_client_endpoints(run), retry_timeout=10.0)
        if run.links.client:
            tail_client.routes = proxied_routes(tail_client.endpoints, _mapping(run))
        tail_spans: dict[str, list[tuple[int, bytes]]] = {j: [] for j in run.journals}
        tail_errors: list[str] = []
        tails = [asyncio.ensure_future(tail(tail_client, j, tail_spans[j], tail_errors))
                 for j in run.journals]
        await asyncio.sleep(cfg.duration)
        stop.set()
        report = await after_writes(run, admin, nemesis, nem, writers, tails, tail_client,
                                    tail_spans, tail_errors, group, watching, meta, started)
        return report, meta
    finally:
        await clean_up(run, group, watching, writer_client, admin)
        record_stalls(run, report, meta)
        record_crashes(run, report, meta)


def default_history_path(out: str | None) -> str | None:
    return str(Path(out).with_suffix(".history.jsonl")) if out else None
