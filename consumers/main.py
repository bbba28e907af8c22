"""`quire consumer run APP --zone Z --id ID`: run a consumer member.

etcd, the coordinators and the key prefix come from flags, else the settings
(QUIRE_ETCD_URL, QUIRE_BROKER, …), else a running `quire up` (protocol/discovery.py).

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
        etcd: str = typer.Option(None, "--etcd", help="etcd URL (default $QUIRE_ETCD_URL, else "
                                 "the local cluster `quire up` runs)."),
        zone: str = typer.Option(..., "--zone"),
        member_id: str = typer.Option(..., "--id", help="This member's suffix within its zone."),
        root: str = typer.Option(None, "--root", help="etcd key prefix (default $QUIRE_ETCD_ROOT "
                                 "or /quire)."),
        broker: str = typer.Option(None, "--broker", help="Coordinator host:port list "
                                   "(default $QUIRE_BROKER, else the local cluster, else "
                                   "127.0.0.1:8080)."),
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
    configure_logging(log_format, log_level, stream=sys.stderr, count_errors=True)
    # `kill -USR1 <pid>` dumps every thread's stack: the cheapest hang diagnosis there is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    me = ProcessId(zone, member_id)
    me.validate("member")
    from .app import load_app

    application = load_app(app)
    from protocol.config import load_settings

    # Flags, then QUIRE_* variables and the config file, then a running `quire up`.
    settings = load_settings({"etcd_url": etcd, "etcd_root": root, "broker": broker})
    etcd_url, prefix, endpoints = settings.etcd_url, settings.etcd_root, settings.broker
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

    from .member import ConsumerMember

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    os.makedirs(data_dir, exist_ok=True)
    etcd = await _reach_etcd(etcd_url)
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


async def _reach_etcd(url: str) -> object:
    """A connected etcd client that answered once, or Unavailable within ~5 s naming etcd,
    the URL and what sets it (a member cannot do anything without etcd)."""
    from protocol.discovery import effective_env
    from protocol.errors import Unavailable
    from topology.etcd import connect
    from topology.etcd_client import EtcdTLS

    try:
        return await asyncio.wait_for(
            connect(url, probe=4.0, tls=EtcdTLS.from_env(effective_env())), 5.0)
    except Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure here means "not reachable"
        text = " ".join(str(exc).split()) or "no answer within 5s"
        if "QUIRE_ETCD_URL" in text:
            raise Unavailable(text) from None
        why = text.rpartition(": ")[2] or type(exc).__name__
        raise Unavailable(f"etcd unreachable at {url}: {why} (set QUIRE_ETCD_URL or --etcd)") from None


if __name__ == "__main__":
    command()
