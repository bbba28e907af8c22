"""`quire consumer run APP --etcd URL --zone Z --id ID`: run a consumer member.

Contributed to the `quire` command through the `quire.commands` entry point
(`consumer = "consumers.main:command"`), so the CLI layer never imports this role.

Exit codes: 0 after a clean release (SIGTERM/SIGINT: commit, release every shard, revoke
the lease), 7 for an invalid APP or flag. A member whose lease was lost (e.g. paused past
its TTL) abandons its shards without writing and re-announces itself; it does not exit.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys

import typer

from protocol import ProcessId
from protocol.errors import ValidationError
from protocol.logs import configure_logging

command = typer.Typer(help="Run consumer members (stateful shards over journals).",
                      no_args_is_help=True, pretty_exceptions_enable=False)


@command.callback()
def group() -> None:
    """Consumer members: `quire consumer run APP …`."""


@command.command("run")
def run(app: str = typer.Argument(..., help="The application, module:object."),
        etcd: str = typer.Option(None, "--etcd", help="etcd URL (default $QUIRE_ETCD_URL)."),
        zone: str = typer.Option(..., "--zone"),
        member_id: str = typer.Option(..., "--id", help="This member's suffix within its zone."),
        root: str = typer.Option(None, "--root", help="etcd key prefix (default $QUIRE_ETCD_ROOT "
                                 "or /quire)."),
        broker: str = typer.Option(None, "--broker", help="Coordinator host:port list "
                                   "(default $QUIRE_BROKER or 127.0.0.1:8080)."),
        data_dir: str = typer.Option(None, "--data-dir", help="Local stores (default "
                                     "./consumer-<zone>-<id>)."),
        ttl: float = typer.Option(10.0, "--ttl", help="Member lease TTL, seconds."),
        limit: int = typer.Option(1024, "--limit", help="Most shards this member takes."),
        snapshot_interval: float = typer.Option(10.0, "--snapshot-interval",
                                                help="Seconds between store snapshots."),
        selector_refresh: float = typer.Option(10.0, "--selector-refresh",
                                               help="Seconds between re-listings of selector "
                                                    "sources (new matching journals are read)."),
        metrics_port: int = typer.Option(0, "--metrics-port", help="Serve Prometheus metrics on "
                                         "<metrics-addr>:<port> (0 = off)."),
        metrics_addr: str = typer.Option("127.0.0.1", "--metrics-addr",
                                         help="Address of the metrics server (0.0.0.0 when "
                                              "Prometheus scrapes from another container)."),
        log_level: str = typer.Option("INFO", "--log-level"),
        log_format: str = typer.Option("auto", "--log-format")) -> None:
    """Register a member, take shards the allocator places here, and process them."""
    configure_logging(log_format, log_level, stream=sys.stderr)
    # `kill -USR1 <pid>` dumps every thread's stack: the cheapest hang diagnosis there is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    me = ProcessId(zone, member_id)
    me.validate("member")
    from .app import load_app

    application = load_app(app)
    etcd_url = etcd or os.environ.get("QUIRE_ETCD_URL") or "http://127.0.0.1:2379"
    prefix = (root or os.environ.get("QUIRE_ETCD_ROOT") or "/quire").rstrip("/")
    endpoints = broker or os.environ.get("QUIRE_BROKER") or "127.0.0.1:8080"
    directory = data_dir or os.path.abspath(f"consumer-{zone}-{member_id}")
    if ttl < 1:
        raise ValidationError("ttl", f"{ttl} must be >= 1 second")
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=metrics_addr)
    raise typer.Exit(asyncio.run(_main(application, etcd_url, prefix, endpoints, me, directory,
                                       ttl, limit, snapshot_interval, selector_refresh)))


async def _main(app, etcd_url: str, root: str, endpoints: str, me: ProcessId,  # type: ignore[no-untyped-def]
                data_dir: str, ttl: float, limit: int, snapshot_interval: float,
                selector_refresh: float) -> int:
    from quire.client import Client
    from topology.etcd import connect

    from .member import ConsumerMember

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    os.makedirs(data_dir, exist_ok=True)
    etcd = await connect(etcd_url)
    client = Client(endpoints, retry_timeout=30.0)
    ready = asyncio.Event()
    try:
        member = ConsumerMember(etcd=etcd, client=client, root=root, me=me, app=app,
                                data_dir=data_dir, ttl=ttl, limit=limit,
                                snapshot_interval=snapshot_interval,
                                selector_refresh=selector_refresh)
        runner = asyncio.create_task(member.run(stop, ready))
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            print(f"ready {me}", flush=True)
        waiter.cancel()
        return await runner
    finally:
        await client.close()
        await etcd.close()


if __name__ == "__main__":
    command()
