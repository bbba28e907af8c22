"""The end of a chaos run: writes stopped, everything healed, read back and checked,
then everything the run started stopped (chaos/runner.py calls in).

    writers' last appends -> the nemesis's last fault -> tail readers stopped -> heal
    -> routed? -> barrier appends -> read-back -> checker -> consumers' catch-up and
    check -> clean-up (members, clients, cluster, faulty disks, proxies)

Every wait here is bounded through chaos/bounded.py: one that does not finish in time
is recorded as a harness stall naming what it waited for and where it was stuck (the
run's `harness_stalls`, and the report's count of the same name: liveness not ok), and
a step the check cannot do without (the read-back, the consumers' read) ends the run
with `HarnessStall` instead of hanging it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

import structlog

from quire.client import Client
from tools.log_crashes import crashes

from .checker import Report, check
from .consumer_check import check_consumers
from .consumer_group import ConsumerGroup
from .nemesis import Nemesis
from .readback import read_back

_Run = Any
"""chaos.runner._Run (cfg, history, links, cluster, journals, stalls...): not imported,
it imports this module."""

__all__ = ["after_writes", "clean_up", "record_stalls", "wait_routed"]

log = structlog.get_logger("chaos.runner")

# Bounds of the waits after the write phase (seconds; chaos/bounded.py). Generous: a
# bound is only hit by a wait that would otherwise never end, at any load seen here.
NEMESIS_END = 60.0
"""The fault in progress when the writes end: held, healed (a restart: up to 3 tries)."""
STOP_TIMEOUT = 30.0
"""Tasks cancelled, clients and proxies closed."""
HEAL_TIMEOUT = 600.0
"""heal_all: every dead service restarted (each start bounded, 3 tries each)."""
BARRIERS_TIMEOUT = 150.0
"""_barriers' own deadline is 90 s (+ one attempt of up to 30 s)."""
READ_BACK_TIMEOUT = 600.0
"""Every journal read back, concurrently: final reads are bounded at 2 x 60 s, replica
views at 30 s each; the store listing and fetches have no bound of their own."""
FINISH_READS = 600.0
"""The consumers' catch-up (finish_timeout) plus the final reads of their sources and
output (2 x 60 s each)."""
MEMBERS_STOP = 30.0
"""Per consumer member: SIGTERM, 10 s, SIGKILL, 10 s (ConsumerGroup.close)."""
CLUSTER_STOP = 300.0
"""Worker, coordinators, S3, Redis, etcd: 5 s + 5 s each at most."""
DISKS_STOP = 120.0
"""Each errfs: a lazy unmount (30 s), its process stopped, the mount gone (10 s)."""



async def wait_routed(admin: Client, run: _Run, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            entries = await asyncio.wait_for(admin.list_journals(), 10.0)
            ok = {e.spec.name for e in entries
                  if e.route.primary >= 0 and len(e.route.members) >= e.spec.replication}
            if set(run.journals) <= ok:
                return True
        except Exception as exc:  # noqa: BLE001 - not yet
            log.debug("runner.wait_routed", error=str(exc))
        await asyncio.sleep(0.5)
    return False


async def _barriers(admin: Client, run: _Run, timeout: float = 90.0
                    ) -> tuple[dict[str, int], dict[str, str], dict[str, float]]:
    """Each journal's write head as first seen after healing, then zero-byte appends
    (transaction barriers: they make a new primary re-synchronise its pipeline, adopting
    the longest committed fragment among its replicas) until one succeeds or `timeout`.
    Returns the heads, the last error of journals whose barrier never succeeded (they
    stayed unavailable after healing) and the seconds each barrier took."""
    heads: dict[str, int] = {}
    errors: dict[str, str] = {}
    took: dict[str, float] = {}
    t0 = time.monotonic()
    deadline = t0 + timeout

    async def one(journal: str) -> None:
        try:
            heads[journal] = await asyncio.wait_for(admin.write_head(journal), 20)
        except Exception as exc:  # noqa: BLE001 - reported
            errors[journal] = f"head: {type(exc).__name__}: {exc}"[:200]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(admin.append(journal, b"", retry_timeout=min(left, 20)),
                                       min(left, 30))
                took[journal] = round(time.monotonic() - t0, 2)
                errors.pop(journal, None)
                return
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                errors[journal] = f"barrier: {type(exc).__name__}: {exc}"[:200]
                await asyncio.sleep(1.0)

    await asyncio.gather(*(one(j) for j in run.journals))
    return heads, errors, took


async def after_writes(run: _Run, admin: Client, nemesis: Nemesis, nem: asyncio.Future[Any],
                        writers: list[asyncio.Future[None]], tails: list[asyncio.Future[None]],
                        tail_client: Client, tail_spans: dict[str, list[tuple[int, bytes]]],
                        tail_errors: list[str], group: ConsumerGroup | None,
                        watching: asyncio.Future[None] | None, meta: dict[str, Any],
                        started: float) -> Report:
    """Stop, heal, read back and check, every wait bounded (chaos/bounded.py): a step
    that does not finish in time is recorded as a harness stall, and one the check
    cannot do without ends the run with HarnessStall naming it."""
    cfg, stalls = run.cfg, run.stalls
    # (Not a stall when it times out: a writer still re-sending an identified append
    # waits on the cluster, not the harness; it is cancelled, as it always was.)
    await asyncio.wait(writers, timeout=cfg.append_timeout + 10)
    for w in writers:
        w.cancel()
    await stalls.wait("the nemesis's last fault", nem, NEMESIS_END)
    for t in tails:
        t.cancel()
    await stalls.wait("the tail readers to stop", asyncio.gather(*tails, return_exceptions=True),
                      STOP_TIMEOUT)
    await stalls.wait("the tail client to close", tail_client.close(), STOP_TIMEOUT)
    meta["reader_errors"] = len(tail_errors)
    meta["reader_error_examples"] = tail_errors[:5]
    await stalls.wait("healing (paused processes resumed, dead ones restarted)",
                      nemesis.heal_all(), HEAL_TIMEOUT)
    meta["wall_seconds"] = round(time.monotonic() - started, 1)
    meta["identified_writers"] = cfg.identified
    meta["identified_resent"] = run.resent
    meta["skipped_faults"] = nemesis.skipped
    meta["proxy_stats"] = {p.name: asdict(p.stats) for p in run.links.all()}
    meta["routed_after_heal"] = await stalls.wait(
        "every journal routed after healing", wait_routed(admin, run, 60.0), 90.0,
        default=False)
    (meta["heads_before_barrier"], meta["unavailable_after_heal"],
     meta["barrier_seconds"]) = await stalls.wait(
        "the barrier appends", _barriers(admin, run), BARRIERS_TIMEOUT,
        default=({}, {j: "barrier: stalled (harness)" for j in run.journals}, {}))
    members: dict[str, list[str]] = {}
    assert run.cluster is not None
    real = {str(c.process_id): c.endpoint for c in run.cluster.coordinators}
    try:
        for entry in await stalls.wait("the journal list", admin.list_journals(), 40.0,
                                       default=[]):
            members[entry.spec.name] = [real[str(m)] for m in entry.route.members
                                        if str(m) in real]
    except Exception as exc:  # noqa: BLE001 - then read every coordinator's replica
        log.warning("runner.list_failed", error=str(exc))
    for journal in run.journals:
        if not members.get(journal):  # no route: ask every coordinator for its replica
            members[journal] = list(real.values())
    readbacks = await stalls.wait(
        "the read-back (final reads, replica views, store fragments)",
        read_back(admin, run.journals, members, run.store_url, run.store_options),
        READ_BACK_TIMEOUT, required=True)
    for rb in readbacks:
        rb.head_seen = meta["heads_before_barrier"].get(rb.journal, -1)
        rb.unavailable = meta["unavailable_after_heal"].get(rb.journal, "")
        rb.views["reader"] = tail_spans.get(rb.journal, [])
    report = check(readbacks, run.history.ops, run.history.faults)
    if cfg.hosts:
        from .net_faults import isolation_recovery

        meta["host_recovery"] = isolation_recovery(run.history.faults, run.history.ops)
    if group is not None:
        shards, meta["consumers"] = await stalls.wait(
            "the consumers' catch-up and the read of their sources and output",
            group.finish(admin), group.cfg.finish_timeout + FINISH_READS, required=True)
        assert watching is not None  # polled through the catch-up too
        watching.cancel()
        await stalls.wait("the consumer primary watch to stop",
                          asyncio.gather(watching, return_exceptions=True), STOP_TIMEOUT)
        consumer = check_consumers(shards, group.watch, group.output)
        report.add_consumers(consumer.counts, consumer.examples, consumer.shards)
    return report


async def clean_up(run: _Run, group: ConsumerGroup | None, watching: asyncio.Future[None] | None,
                    writer_client: Client | None, admin: Client | None) -> None:
    """Everything the run started stopped, each step bounded (a stall is recorded and the
    next step still runs: members, clients, the cluster, the faulty disks, the proxies)."""
    stalls = run.stalls
    run.history.close()
    if watching is not None and not watching.done():
        watching.cancel()
        await stalls.wait("the consumer primary watch to stop",
                          asyncio.gather(watching, return_exceptions=True), STOP_TIMEOUT)
    if group is not None:
        await stalls.thread("the consumer members to stop", group.close,
                            timeout=MEMBERS_STOP * max(1, len(group.services)))
    for name, c in (("the writers' client", writer_client), ("the admin client", admin)):
        if c is not None:
            await stalls.wait(f"{name} to close", c.close(), STOP_TIMEOUT)
    if run.cluster is not None:
        await stalls.thread("the cluster to stop", run.cluster.close, timeout=CLUSTER_STOP)
    if run.local is not None:  # (after the coordinators stopped)
        await stalls.thread("the faulty disks to unmount", run.local.close, timeout=DISKS_STOP)
    for p in run.links.all():
        await stalls.wait(f"proxy {p.name} to close", p.close(), STOP_TIMEOUT)


def record_crashes(run: _Run, report: Report | None, meta: dict[str, Any]) -> None:
    """The exceptions the coordinators caught and logged (tools/log_crashes.py), in the
    run's metadata and its report (not ok)."""
    cluster = run.cluster
    found = [] if cluster is None else crashes((c.name, c.log_path) for c in cluster.coordinators)
    meta["caught_crashes"] = found
    if report is not None:
        report.add_crashes(found)


def record_stalls(run: _Run, report: Report | None, meta: dict[str, Any]) -> None:
    """The run's stalls in its metadata and its report (liveness: not ok)."""
    meta["harness_stalls"] = list(run.stalls.items)
    if report is not None:
        report.add_stalls(run.stalls.items)


