"""What a coordinator process hosts (the lower half of the server).

`Host` holds the settings, the spool files, the persister and a Replica per hosted
journal, and implements what the append FSM needs of a broker (append_fsm.Broker).
Everything above it — the etcd follower (hosting.py), the drain (drain.py) and the
connection server (server.py) — works on a Host; it imports none of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any

from protocol.auth import Capability, Keyring

from protocol import Fragment, ProcessId, Route, Suspend
from protocol.logs import get_logger
from protocol.mux_pool import MuxPool

from . import metrics
from .auth_gate import PeerTokens
from .pipeline import REPLICATE_ACK
from .producer_log import LOG_FILE, LoggedProducerTable
from .recovery import Head, RecoveredFragments, journals_with_marks, read_heads, scan_spool_dir
from .replica import LocalPersister, Persister, Replica
from .spool import DiskFiles
from .spool_health import SpoolHealth

log = get_logger(__name__)

RETIRED_HEADS_MAX = 65536
"""Remembered heads of forgotten replicas (~100 bytes each, oldest dropped first)."""


@dataclass
class ServerConfig:
    zone: str
    suffix: str
    listen: str
    etcd_url: str
    root: str = "/quire"
    spool_dir: str = "/tmp/quire-spool"
    redis_url: str | None = None
    journal_limit: int = 1024
    lease_ttl: float = 20.0
    min_append_rate: float = 64 * 1024
    drain_timeout: float = 30.0
    """On SIGTERM, the bound of the whole drain (drain.py)."""
    pulse_interval: float = 60.0
    run_allocator: bool = True
    advertise: str | None = None
    """host:port peers and clients are told to use (e.g. a proxy in front of us);
    defaults to `listen`."""
    keyring: Keyring | None = None
    """Auth on when set: tokens are checked at every RPC entry (auth_gate.py)."""
    server_ssl: SSLContext | None = None
    """Serve TLS (mTLS when it requires client certificates)."""
    peer_ssl: SSLContext | None = None
    """The client context for hops to peers (replicate, proxies) when they serve TLS."""
    spool_low_water: int = 0
    """Refuse appends (SPOOL_FULL) while the spool filesystem has fewer free bytes than
    this; 0: only when a write fails with ENOSPC (spool_health.py)."""
    max_unpersisted: int = 0
    """Refuse appends (SPOOL_FULL) while this member holds more bytes not yet in the
    fragment store (open spools + closed local fragments); 0: no bound."""

    @property
    def endpoint(self) -> str:
        return self.advertise or self.listen


class Host:
    """What this process hosts: its settings, spool files, persister and one Replica per
    journal assigned here, plus the count of appends being served. The FSM, the RPC
    handlers, the topology follower (hosting.py) and the drain (drain.py) work on it;
    server.py serves connections over it."""

    def __init__(self, cfg: ServerConfig, persister: Persister | None = None) -> None:
        self.cfg = cfg
        self.me = ProcessId(cfg.zone, cfg.suffix)
        self.files = DiskFiles(cfg.spool_dir)
        self.files.before_seal = self._before_seal
        self.health = SpoolHealth(cfg.spool_dir, str(self.me), low_water=cfg.spool_low_water,
                                  max_unpersisted=cfg.max_unpersisted,
                                  unpersisted=self.spool_bytes)
        self.files.health = self.health
        self.health.on_change.append(self._health_changed)
        self.persister: Persister = persister or LocalPersister()
        holder = getattr(self.persister, "_quire_holder", None)
        if isinstance(holder, dict):
            holder["server"] = self  # the persister's callbacks look up routes through us
        self.replicas: dict[str, Replica] = {}
        self.recovered = RecoveredFragments({})
        self.retired_heads: dict[str, Head] = {}
        """Write heads of replicas we retired and forgot (forget_replica): a journal
        assigned here again resumes there, as after a graceful exit, instead of at 0."""
        """Closed fragments found on disk at start, of journals not hosted (again) yet."""
        # Read at scrape time (never on the hot path), summed over the replicas.
        metrics.SPOOL_BYTES.set_function(self.spool_bytes)
        self.topology: Any = None
        """The etcd side (hosting.Hosting), attached by the server."""
        self.keyspace = None  # set once connected
        self.peer_tokens = PeerTokens(cfg.keyring, f"peer:{self.me}", cfg.peer_ssl)
        self.replicate_mux = MuxPool(REPLICATE_ACK)
        """Our replicate connections, one per peer, every pipeline's stream to that
        peer a channel of it (protocol/mux.py, replicate_mux.py)."""
        self._appends = 0
        self._appends_idle = asyncio.Event()
        self._appends_idle.set()
        self._tg: asyncio.TaskGroup | None = None
        self.index_loader: Callable[[str], None] | None = None
        """Set by hosting when a fragment index is kept (Redis): loads one journal's
        index now. A primary then waits for that first load (append_fsm.py)."""

    @property
    def index_expected(self) -> bool:
        return self.index_loader is not None

    # -- what the FSM and handlers need (append_fsm.Broker) ------------------------------

    async def resolve(self, journal: str, min_revision: int = 0):  # noqa: ANN201
        return await self.topology.resolver.resolve(journal, min_revision=min_revision)

    def peer_auth(self, cap: Capability, journal: str) -> dict[str, Any]:
        """`token` and `ssl` for a hop to a peer on behalf of `journal` (a derived token:
        the client's is never forwarded)."""
        return {"token": self.peer_tokens.token(cap, journal), "ssl": self.cfg.peer_ssl}

    def replica(self, journal: str) -> Replica:
        r = self.replicas.get(journal)
        if r is None:
            r = self.replicas[journal] = Replica(journal, self.files, self._on_closed)
            # Its directory and first spool file, made now on a thread: its first append
            # (at each member) then makes no inode on the event loop (spool_spares.py).
            self.files.prepare(journal)
            local = self.recovered.take(journal)
            r.adopt_local(local)
            # The producer table, replayed from the marks log a previous run left (only
            # marks of bytes in sealed fragments: the open spool did not survive).
            r.spool.producers = LoggedProducerTable.open(
                journal, self.files.root / journal / LOG_FILE, self.recovered.take_marks(journal),
                max((lf.fragment.end for lf in local), default=0))
            head = self.recovered.take_head(journal) or self.retired_heads.pop(journal, None)
            if head is not None:
                r.resume_at(head)
            metrics.REPLICAS.set(len(self.replicas))
            if self.index_loader is not None:
                self.index_loader(journal)
        return r

    def forget_replica(self, journal: str) -> None:
        """Drop a retired replica that holds nothing unpersisted, remembering its write
        head. When every member of a route was retired at once (their leases expired
        together, e.g. etcd paused past the TTL) and the journal is assigned again,
        fresh replicas would synchronize at 0 and refuse every append with
        INDEX_HAS_GREATER_OFFSET until an operator's reset-head; with the head they
        resume where they were (the largest offset still wins the sync)."""
        replica = self.replicas.pop(journal)
        spool = replica.spool
        end = spool.end if replica.stale_from is None else min(spool.end, replica.stale_from)
        if end > 0:
            self.retired_heads.pop(journal, None)  # re-inserted last: the newest stays
            self.retired_heads[journal] = Head(end=end, registers=spool.registers,
                                               codec=spool.fragment.codec,
                                               producers=spool.producers.snapshot())
            while len(self.retired_heads) > RETIRED_HEADS_MAX:
                del self.retired_heads[next(iter(self.retired_heads))]
        replica.close()
        metrics.REPLICAS.set(len(self.replicas))

    def spool_bytes(self) -> float:
        """Committed bytes in open spools plus closed fragments still on local disk."""
        total = self.recovered.bytes
        for r in list(self.replicas.values()):
            total += r.spool.content_length
            for lf in r.local:
                total += lf.fragment.end - lf.fragment.begin
        return float(total)

    def recover(self) -> None:
        """Closed fragments of a previous run go to the persister again (recovery.py)."""
        journals = self.keyspace.journals

        def codec_of(journal: str):  # noqa: ANN202
            entry = journals.get(journal)
            return entry.spec.fragment.compression_codec if entry is not None else None

        self.recovered = RecoveredFragments(scan_spool_dir(self.files, codec_of),
                                            read_heads(self.files, journals), self.files,
                                            journals_with_marks(self.files, journals))
        for journal, frags in self.recovered.by_journal.items():
            log.info("re-queueing closed fragments of a previous run", journal=journal,
                     count=len(frags), end=frags[-1].fragment.end)
            for lf in frags:
                # primary=True: send now. Nobody else may still hold these bytes, and a
                # duplicate persist task costs the worker one Exists check.
                self._on_closed(lf.fragment, lf.file.path if lf.file else None, True)

    async def advertise_route(self, journal: str, route: Route) -> int:
        return await self.topology.advertise(journal, route)

    async def update_suspend(self, journal: str, suspend: Suspend) -> int:
        from .suspend import update_suspend

        return await update_suspend(self.topology.client, self.keyspace, journal, suspend)

    async def teardown_pipeline(self, replica: Replica) -> None:
        pln, replica.pipeline = replica.pipeline, None
        replica.lane = None  # (the lane's checks were of that pipeline: let it go)
        if pln is not None:
            await pln.close()
            replica.spool_lock.release()

    def _health_changed(self, health: SpoolHealth) -> None:
        if not health.ok:
            self.files.close()  # the pooled files' room goes back to the disk
        on_health = getattr(self.topology, "on_health", None)
        if on_health is not None:
            on_health(health)  # the member key says it; a failed spool gives its journals away

    def _before_seal(self, fragment: Fragment) -> None:
        r = self.replicas.get(fragment.journal)
        if r is not None and isinstance(r.spool.producers, LoggedProducerTable):
            r.spool.producers.flush()  # the fragment's marks, before its file is sealed

    def _on_closed(self, fragment: Fragment, path: str | None, primary: bool) -> None:
        r = self.replicas.get(fragment.journal)
        if r is not None and isinstance(r.spool.producers, LoggedProducerTable):
            r.spool.producers.sealed(fragment.end)  # after the file's seal (producer_log.py)
        check = getattr(self.topology, "check_retired", None)
        if r is not None and r.retired and check is not None:
            check(r, fragment, path)  # a former member's: compared with the route first
            return
        self.persist(fragment, path, primary)

    def persist(self, fragment: Fragment, path: str | None, primary: bool) -> None:
        """Hand a closed fragment to the persister."""
        closed = getattr(self.persister, "closed", None)
        if closed is not None:
            closed(fragment, path, primary)  # the Celery persister's non-blocking form
        elif self._tg is not None:
            self._tg.create_task(self.persister.on_closed(fragment, path))

    @property
    def appends_idle(self) -> asyncio.Event:
        """Set while no append RPC is being served (the drain waits for it)."""
        return self._appends_idle

    @property
    def appends_in_flight(self) -> int:
        return self._appends

    def append_started(self) -> None:
        self._appends += 1
        self._appends_idle.clear()

    def append_finished(self) -> None:
        self._appends -= 1
        if self._appends == 0:
            self._appends_idle.set()
