"""`quire dashboard …` (and `python -m dashboards.main …`): serve the live web dashboard.

A layer-4 role: it reads etcd (aetcd) and asks the coordinators (quire.client) and
imports no other role.
"""

from __future__ import annotations

import asyncio
import os

import typer

DEFAULT_LISTEN = "127.0.0.1:8090"


def command(
    etcd: str | None = typer.Option(None, "--etcd",
                                    help="etcd URL, e.g. http://127.0.0.1:2379 (default QUIRE_ETCD_URL)."),
    root: str | None = typer.Option(None, "--root", help="etcd key prefix (default QUIRE_ETCD_ROOT or /quire)."),
    listen: str = typer.Option(DEFAULT_LISTEN, "--listen", help="host:port to serve the dashboard on."),
    broker: str | None = typer.Option(None, "--broker", help="Coordinator host:port list (comma-separated); "
                                                                "default: the members' endpoints in etcd."),
    redis: str | None = typer.Option(None, "--redis",
                                     help="Redis URL of the index workers, for the storage columns "
                                          "(default QUIRE_REDIS_URL if set; none: no storage columns)."),
    timeout: float = typer.Option(2.0, "--timeout", help="Seconds allowed for each etcd or coordinator call."),
    log_format: str | None = typer.Option(None, "--log-format", help="auto | json | console."),
    log_level: str | None = typer.Option(None, "--log-level"),
) -> None:
    from protocol.config import ConfigError, load_settings
    from protocol.logs import configure_logging

    from .server import DashboardServer
    from .state import StateCollector

    try:
        s = load_settings({"etcd_url": etcd, "etcd_root": root, "log_format": log_format,
                           "log_level": log_level})
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--listen: expected host:port, got {listen!r}")
    except ConfigError as exc:
        typer.echo(f"quire dashboard: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(s.log_format, s.log_level)
    from protocol.credentials import settings_keyring

    keyring = settings_keyring(s)  # auth on for /api/state when the cluster's keys are set
    server_ssl = None
    if s.tls_cert and s.tls_key:  # TLS on: HTTPS with the cluster's certificate
        from protocol.tls import server_context

        server_ssl = server_context(s.tls_cert, s.tls_key)
    brokers = [b.strip() for b in (broker or "").split(",") if b.strip()]

    async def main() -> None:
        collector = StateCollector(s.etcd_url, s.etcd_root, brokers=brokers, timeout=timeout,
                                   redis_url=redis or os.environ.get("QUIRE_REDIS_URL") or None)
        server = DashboardServer(collector, host.strip("[]"), int(port), keyring=keyring,
                                 ssl=server_ssl)
        await server.serve_forever()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


command.__doc__ = "Serve the live web dashboard (journals, brokers, routes, write heads, storage)."


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
