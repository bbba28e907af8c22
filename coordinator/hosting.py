"""The coordinator's side of the topology: etcd session, hosted replicas, pulses.

`Hosting` connects to etcd, mirrors the root (KeySpace), announces the member, runs
the allocator, and keeps the set of hosted replicas equal to this member's assignments.
One task (`_follow`) reacts to every keyspace change, re-examining only the journals the
change touched (KeySpace.touched; a member, lease-standing or re-listing change, and a
quiet FULL_PASS_INTERVAL, examine every one — so filling thousands of routes costs each
route's own changes, not every journal per change): it creates replicas for new
assignments, tears down pipelines whose route moved (so the new primary can take the
replicas' spools), and pulses each journal for which we became primary (or whose route
changed) — a zero-byte append through the ordinary FSM, retried with backoff until it
succeeds for that route (pulses.py).

Safety on route changes (fence.py): every keyspace change aborts the replicate streams
whose route is superseded (the spool goes to the new primary at once), and a replica
whose assignment went away is *retired*, never dropped: its spool's committed content
is closed and handed to the persister, and the Replica (its closed fragments, readable
and fetchable, and its spool offset, which it brings to the next pipeline sync if it is
assigned again) stays until the index shows everything persisted.

Losing membership (topology/membership.py notices it at once: our member key deleted
or taken over, or our lease expired, e.g. the process was paused past its TTL):
`_fence` drops every pipeline and replicate stream at once (we must not act as primary
a moment longer), then `Membership.maintain` revokes the old lease (etcd deletes every
assignment and leader key still under it) and re-announces under a new one, so the
allocator can place journals here again. Re-registering in place rather than exiting
keeps the spools (which may hold the only copy of committed, unpersisted content) and
keeps the cluster's capacity when nothing restarts us; the old incarnation's state is
harmless because the peers fence it by route (docs/reliability.md, "Own membership").

Standing: while etcd has not confirmed our lease for its TTL minus a margin (etcd
paused or unreachable), the resolver reports no primary for our journals and
`_on_standing` fails our pipelines, before etcd could expire the lease and another
member take over; once a refresh succeeds we reconcile and pulse again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

from protocol.logs import get_logger
from protocol import Route

from topology.assignments import advertise_route
from topology.etcd import connect
from . import metrics
from .fence import abort_superseded
from topology.keyspace import KeySpace
from topology.membership import BrokerSpec, Membership
from .pipeline import PipelineBroken
from .pulses import Pulses
from .resolver import Resolver

if TYPE_CHECKING:
    from .host import Host

log = get_logger(__name__)

FULL_PASS_INTERVAL = 120.0
"""Seconds without any change after which every hosted journal is re-examined anyway."""

class Hosting:
    def __init__(self, server: Host) -> None:
        self.server = server
        self.cfg = server.cfg
        self.client = None
        self.keyspace: KeySpace | None = None
        self.resolver: Resolver | None = None
        self.membership: Membership | None = None
        self._changed = asyncio.Event()
        self._dirty: set[str] = set()
        """Journals to re-examine at the next reconcile (`_mark`)."""
        self._dirty_all = True
        """Re-examine every journal (a load, a member change, standing, a safety pass)."""
        self._deferred: set[str] = set()
        """Unassigned replicas whose retirement waits on a pipeline or lock: re-examined
        at every reconcile until they retire."""
        self.pulses = Pulses(server, lambda journal: self.resolver.resolve_now(journal),
                             self._spawn, self._mark_one, self.cfg.pulse_interval)
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._health_lock = asyncio.Lock()

    def _spawn(self, coro, name: str | None = None) -> None:  # noqa: ANN001
        assert self._tg is not None
        task = self._tg.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Hosting]:
        cfg = self.cfg
        self.client = await connect(cfg.etcd_url)
        try:
            async with KeySpace(self.client, cfg.root) as ks:
                self.keyspace = ks
                self.resolver = Resolver(ks, self.server.me)
                spec = BrokerSpec(id=self.server.me, endpoint=cfg.endpoint, journal_limit=cfg.journal_limit)
                async with Membership(self.client, cfg.root, spec, cfg.lease_ttl,
                                      wait_absent=cfg.lease_ttl + 5) as member:
                    self.membership = member
                    # Our view is current only in good standing and once the keyspace
                    # has caught up with the revision that standing dates from.
                    self.resolver.may_lead = lambda: (member.in_good_standing and
                                                      ks.revision >= member.standing_revision)
                    member.on_standing.append(self._on_standing)
                    ks.on_change.append(lambda ks: self._mark(ks.touched))
                    yield self
        finally:
            with contextlib.suppress(Exception):
                await self.client.close()

    async def start(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg
        self._spawn(self._follow(), name="hosting-follow")
        self._spawn(self._watch_lease(), name="hosting-lease")
        self._spawn(self.pulses.run(), name="hosting-pulse")
        if self.cfg.run_allocator:
            from topology.allocator import Allocator

            self._spawn(Allocator(self.client, self.keyspace, self.server.me, self.cfg.root).run(),
                           name="allocator")
        if self.cfg.redis_url:
            self._start_index_watch(tg)

    def _start_index_watch(self, tg: asyncio.TaskGroup) -> None:
        from .index_watch import IndexWatch, list_store_index, listable

        server = self.server

        def apply(journal: str, fragments) -> None:  # noqa: ANN001
            replica = server.replicas.get(journal)
            if replica is not None:
                replica.set_remote_index(fragments)
                if replica.retired:
                    self._mark_one(journal)  # persisted now: the replica may be forgotten
            server.recovered.persisted(journal, fragments)
            mark = getattr(server.persister, "mark_persisted", None)
            if mark is not None:
                mark(journal, fragments)

        def loaded(journal: str) -> None:
            replica = server.replicas.get(journal)
            if replica is None or replica.index_ready:
                return
            entry = self.keyspace.journals.get(journal) if self.keyspace is not None else None
            stores = entry.spec.fragment.stores if entry is not None else ()
            if not stores or not listable(stores[0]):
                replica.index_loaded()
                return
            # No index in Redis (a new journal — or Redis restarted without persistence
            # and the workers have not listed the store again yet): the store itself says
            # how far the journal was persisted (Gazette lists it), so fresh members can
            # never acknowledge appends at offsets it already holds.
            self._spawn(list_store_index(replica, stores[0]), name=f"index-list:{journal}")

        watch = IndexWatch(self.cfg.redis_url, apply=apply, loaded=loaded,
                           journals=lambda: [*server.replicas, *server.recovered.journals()])
        self._spawn(watch.run(), name="index-watch")

        def load_index(journal: str) -> None:
            if watch.queue(journal):
                self._spawn(watch.flush_queued(), name="index-load")

        server.index_loader = load_index
        run = getattr(server.persister, "run", None)
        if run is not None:
            self._spawn(run(), name="persister")

    def stop(self) -> None:
        """Cancel the topology tasks (the TaskGroup then finishes)."""
        self.pulses.stopped = True
        for task in list(self._tasks):
            task.cancel()

    async def set_exiting(self) -> None:
        if self.membership is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self.membership.set_exiting()

    async def advertise(self, journal: str, route: Route) -> int:
        assert self.keyspace is not None
        return await advertise_route(self.client, self.keyspace, journal, route)

    def on_health(self, health) -> None:  # noqa: ANN001 - spool_health.SpoolHealth
        """The spool's health changed: say so in our member key; a failed spool also
        marks us exiting, so the allocator moves every journal to healthy members."""
        if self._tg is None or self.membership is None:
            return
        self._spawn(self._announce_health(health), name="health")

    async def _announce_health(self, health) -> None:  # noqa: ANN001
        async with self._health_lock:
            try:
                async with asyncio.timeout(30.0):
                    if health.state == health.FAILED:
                        # Our writes fail: no route can be synced away from us, so we
                        # resign at once (our assignments go with our old lease).
                        self._drop_all(f"spool failed: {health.reason}", streams=True)
                        await self.membership.resign(health.summary)
                    else:
                        await self.membership.set_health(health.summary)
            except Exception as exc:  # noqa: BLE001 - said again at the next change
                log.warning("cannot announce the spool's health", error=repr(exc))

    def poke(self, journal: str | None = None) -> None:
        """Re-evaluate `journal` (None: every hosted replica), e.g. a replicate stream
        released its spool."""
        self._mark(None if journal is None else (journal,))

    def _mark(self, journals: Iterable[str] | None) -> None:
        """Have the next reconcile re-examine `journals` (None: every journal)."""
        if journals is None:
            self._dirty_all = True
        else:
            self._dirty.update(journals)
        self._changed.set()

    def _mark_one(self, journal: str) -> None:
        self._mark((journal,))

    async def _watch_lease(self) -> None:
        member = self.membership
        assert member is not None
        await member.maintain(self._fence)

    async def _fence(self, reason: str) -> None:
        """Membership lost: drop everything held under the old lease (before re-announcing)."""
        log.error("membership lost: dropping every pipeline and stream, re-announcing",
                  member=str(self.server.me), reason=reason)
        self._drop_all(f"membership lost: {reason}", streams=True)

    def _on_standing(self, good: bool) -> None:
        if good:
            # Primary again where the keyspace says so, once it has reached the revision
            # standing dates from (may_lead); then pulse.
            if self._tg is not None:
                self._spawn(self._catch_up_view(), name="hosting-catch-up")
            self._mark(None)
            return
        if self.membership is not None and self.membership.lost.is_set():
            return  # lost, not just unconfirmed: `_fence` drops everything next
        log.error("membership lease unconfirmed: stepping down as primary everywhere",
                  member=str(self.server.me))
        self._drop_all("membership lease unconfirmed", streams=False)

    async def _catch_up_view(self) -> None:
        """Bring the mirror to `standing_revision`: that revision may be a write outside
        our prefix, which no event of ours will ever announce (KeySpace._catch_up reads
        the prefix instead); until then we neither lead nor tell a write head."""
        member, ks = self.membership, self.keyspace
        while member is not None and ks is not None and member.in_good_standing \
                and not await ks.wait_for_revision(member.standing_revision, 5.0):
            pass  # (etcd unreachable again: standing will lapse and end this)
        self._mark(None)

    def _drop_all(self, why: str, *, streams: bool) -> None:
        """Fail every pipeline we lead (and with `streams`, abort every replicate stream
        we serve); forget cached resolutions and pulses."""
        self.pulses.forget()
        for replica in list(self.server.replicas.values()):
            replica.resolution = None
            stream = replica.stream
            if streams and stream is not None:
                replica.stream = None
                stream[1].abort()
            pln = replica.pipeline
            if pln is not None:
                pln._fail(PipelineBroken(why))
                self._spawn(self._retire(replica))
        self._mark(None)

    # -- following assignments ------------------------------------------------------------

    async def _follow(self) -> None:
        while True:
            only = None if self._dirty_all else self._dirty
            self._dirty, self._dirty_all = set(), False
            self._changed.clear()
            self._reconcile(only)
            try:
                async with asyncio.timeout(FULL_PASS_INTERVAL):
                    await self._changed.wait()
            except TimeoutError:
                self._dirty_all = True  # the safety net: nothing is missed for long

    def _reconcile(self, only: set[str] | None = None) -> None:
        """Make the hosted replicas follow the assignments: of every journal (`only` is
        None), or of the journals in `only` and the deferred retirements — what a
        keyspace batch touched, so one change costs its journals, not every journal."""
        ks, server, me = self.keyspace, self.server, self.server.me
        assert ks is not None and self.resolver is not None and self._tg is not None
        if only is None:
            mine = {a.journal for a in ks.assignments_of(me)}
            examined = list(server.replicas)
            abort_superseded(server.replicas, self.resolver)
        else:
            only = only | self._deferred
            mine = {j for j in only if any(a.member == me for a in ks.assignments(j))}
            examined = [j for j in only if j in server.replicas]
            abort_superseded({j: server.replicas[j] for j in examined}, self.resolver)
        metrics.RECONCILED.inc(len(mine) + len(examined))
        self._deferred.clear()
        for journal in mine:
            server.replica(journal).retired = False
        for journal in examined:
            replica = server.replicas.get(journal)
            if journal in mine or replica is None:
                continue
            if replica.pipeline is None and not replica.spool_lock.locked() \
                    and not replica.pipeline_lock.locked():
                self.pulses.forget(journal)
                # Never drop committed content: close it for persistence and keep the
                # replica (files, offset) until the index shows it persisted.
                try:
                    remains = replica.retire()
                except OSError as exc:  # a failing spool disk: said, never fatal
                    health = replica.health
                    if health is not None:
                        health.write_failed(exc, f"closing journal {journal}")
                    log.error("cannot close a retired spool", journal=journal, error=repr(exc))
                    continue
                if not remains:
                    server.forget_replica(journal)
            else:
                self._deferred.add(journal)  # its pipeline or a lock is still held
        for journal in mine:
            res = self.resolver.resolve_now(journal)
            replica = server.replicas[journal]
            pln = replica.pipeline
            if pln is not None and (not res.is_primary or not pln.route.equivalent(res.route)
                                    or pln.route.endpoints != res.route.endpoints):
                if not res.is_primary:
                    # Superseded: fail in-flight acknowledgements now (fence.py) rather
                    # than waiting on peers that may be gone.
                    pln._fail(PipelineBroken("no longer the journal's primary"))
                self._spawn(self._retire(replica))
            if res.is_primary:
                self.pulses.want(journal, res.route)

    def check_retired(self, replica, fragment, path: str | None) -> None:  # noqa: ANN001
        """A fragment a retired replica closed: persisted once the route's members are
        found to hold no other bytes at its offsets (retired_check.py)."""
        if self._tg is None:  # not following the keyspace (yet): no route to ask
            self.server.persist(fragment, path, True)
            return
        self._spawn(self._check_then_persist(replica, fragment, path),
                    name=f"retired-check:{fragment.journal}")

    async def _check_then_persist(self, replica, fragment, path: str | None) -> None:  # noqa: ANN001
        from . import metrics
        from .retired_check import stale_from

        try:
            stale = await stale_from(self.server, replica, fragment)
        except Exception:  # noqa: BLE001 - a failed check must not lose the fragment
            log.exception("cannot check a retired fragment; persisting it",
                          journal=fragment.journal)
            stale = None
        if stale is None:
            self.server.persist(fragment, path, True)
            return
        at, holder = stale
        if replica.drop_stale(fragment, at):
            metrics.STALE_FRAGMENTS.inc()
            log.warning("a former member's fragment disagrees with the journal; dropped, "
                        "never persisted", journal=fragment.journal, fragment_begin=fragment.begin,
                        fragment_end=fragment.end, differs_from=at, route_member=holder,
                        why="a later epoch cut this tail and wrote other bytes at its offsets")
        self._mark_one(replica.journal)  # the replica may be forgotten now

    async def _retire(self, replica) -> None:  # noqa: ANN001
        """Tear down a pipeline of an old route once its in-flight appends finished."""
        async with replica.pipeline_lock:
            res = self.resolver.resolve_now(replica.journal)
            pln = replica.pipeline
            if pln is not None and (pln.broken is not None or not res.is_primary
                                    or not pln.route.equivalent(res.route)):
                await self.server.teardown_pipeline(replica)
        self._mark_one(replica.journal)  # a replica no longer assigned may retire now
