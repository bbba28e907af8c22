"""A topology-only member: announce, mirror the keyspace, run the allocator.

    python -m topology.topology_member --etcd http://127.0.0.1:2379 --root /quire \\
        --zone a --id member-1 --endpoint 127.0.0.1:9001 --limit 100 --ttl 3 [--advertise]

The real coordinator server does the same plus serving. Multi-process topology tests
start several of these. With `--advertise` the member plays a journal primary's part in
the consistency protocol: whenever it holds slot 0 of a journal whose assignments do not
all advertise the current route, it writes that route (a real primary does so only after
syncing its replication pipeline).

SIGTERM/SIGINT: mark the member exiting, wait (bounded by --drain-timeout) until the
allocator has moved every assignment away, then revoke the lease and exit 0. A lost
lease exits 3, since this process is no longer a member.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import signal
import sys

import structlog

from protocol.logs import configure_logging
from protocol import ProcessId

from .allocator import Allocator
from .assignments import advertise_route, is_consistent, route_of
from .etcd import AssignmentConflict, EtcdError, connect
from .keyspace import KeySpace
from .membership import BrokerSpec, Membership

log = structlog.get_logger()

EXIT_LEASE_LOST = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m topology.topology_member")
    p.add_argument("--etcd", required=True, help="etcd URL, http://host:port")
    p.add_argument("--root", default="/quire")
    p.add_argument("--zone", required=True)
    p.add_argument("--id", required=True, help="the member's suffix within its zone")
    p.add_argument("--endpoint", default="")
    p.add_argument("--limit", type=int, default=1024, help="journal limit")
    p.add_argument("--ttl", type=float, default=20.0, help="member lease TTL, seconds")
    p.add_argument("--advertise", action="store_true",
                   help="as slot 0, advertise routes (stands in for a real primary)")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--wait-absent", type=float, default=None,
                   help="wait this long for a previous incarnation's key (default ttl + 2)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def advertiser(client, keyspace: KeySpace, me: ProcessId) -> None:  # type: ignore[no-untyped-def]
    """Advertise the route of every journal where `me` is primary, on every change."""
    while True:
        seen = keyspace.changed_revision
        for a in keyspace.assignments_of(me):
            if a.slot != 0:
                continue
            assignments = keyspace.assignments(a.journal)
            if is_consistent(assignments):
                continue
            try:
                await advertise_route(client, keyspace, a.journal, route_of(assignments))
            except (AssignmentConflict, EtcdError) as exc:
                log.debug("advertise raced", journal=a.journal, error=str(exc))
        await keyspace.wait_changed(seen, timeout=5.0)


async def main_async(args: argparse.Namespace) -> int:
    me = ProcessId(args.zone, args.id)
    me.validate()
    spec = BrokerSpec(id=me, endpoint=args.endpoint, journal_limit=args.limit)
    wait_absent = args.wait_absent if args.wait_absent is not None else args.ttl + 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR2, dump_tasks)

    client = await connect(args.etcd)
    try:
        async with Membership(client, args.root, spec, ttl=args.ttl,
                              wait_absent=wait_absent) as membership:
            async with KeySpace(client, args.root) as keyspace:
                allocator = Allocator(client, keyspace, me, args.root)
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(allocator.run(), name="allocator")]
                    if args.advertise:
                        tasks.append(tg.create_task(advertiser(client, keyspace, me),
                                                    name="advertiser"))
                    print(f"ready {me}", flush=True)
                    lost = tg.create_task(membership.lost.wait())
                    stopping = tg.create_task(stop.wait())
                    await asyncio.wait([lost, stopping], return_when=asyncio.FIRST_COMPLETED)
                    if membership.lost.is_set():
                        log.error("lease lost; exiting", member=str(me))
                        for t in (*tasks, stopping):
                            t.cancel()
                        return EXIT_LEASE_LOST
                    await drain(membership, keyspace, me, args.drain_timeout)
                    for t in (*tasks, lost):
                        t.cancel()
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return 0


def dump_tasks() -> None:
    """`kill -USR2 <pid>`: print every asyncio task's stack (where a shutdown is stuck)."""
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


async def drain(membership: Membership, keyspace: KeySpace, me: ProcessId, timeout: float) -> None:
    """Graceful exit: announce it, then wait for the allocator to move our journals."""
    await membership.set_exiting()
    deadline = asyncio.get_running_loop().time() + timeout
    while keyspace.assignments_of(me):
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            log.warning("drain timed out; exiting with assignments", member=str(me),
                        held=len(keyspace.assignments_of(me)))
            return
        await keyspace.wait_changed(keyspace.changed_revision, timeout=remaining)
    log.info("drained", member=str(me))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # `kill -USR1 <pid>` dumps every thread's stack: the cheapest hang diagnosis there is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    configure_logging("json", args.log_level, stream=sys.stderr)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
