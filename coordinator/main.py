"""`quire coordinator …` (and `python -m coordinator.main …`): run one coordinator process."""

from __future__ import annotations

import asyncio
import os
from typing import Optional

import typer

from protocol.runtime import tune_gc_for_server, tune_malloc_for_server


def command(
    zone: Optional[str] = typer.Option(None, "--zone", help="Failure zone of this member."),
    id: Optional[str] = typer.Option(None, "--id", help="Member suffix (unique within the zone)."),
    listen: Optional[str] = typer.Option(None, "--listen", help="host:port to serve on (also the advertised endpoint unless --advertise)."),
    advertise: Optional[str] = typer.Option(None, "--advertise", help="host:port announced in etcd for peers and clients (e.g. a proxy in front of --listen)."),
    etcd: Optional[str] = typer.Option(None, "--etcd", help="etcd URL, e.g. http://127.0.0.1:2379."),
    root: Optional[str] = typer.Option(None, "--root", help="etcd key prefix (default /quire)."),
    spool_dir: Optional[str] = typer.Option(None, "--spool-dir", help="Directory for spool files."),
    redis: Optional[str] = typer.Option(None, "--redis", help="Redis URL: persist tasks and the fragment index."),
    journal_limit: Optional[int] = typer.Option(None, "--journal-limit", help="Most journals this member hosts."),
    lease_ttl: Optional[float] = typer.Option(None, "--lease-ttl", help="Membership lease TTL, seconds."),
    min_append_rate: Optional[int] = typer.Option(None, "--min-append-rate", help="Bytes/s below which appenders are aborted."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus /metrics on this port."),
    metrics_addr: str = typer.Option("127.0.0.1", "--metrics-addr", help="Address the metrics server binds (0.0.0.0: every interface)."),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", help="On SIGTERM, most seconds spent draining (in-flight appends, rolling led spools, waiting for their persistence)."),
    pulse_interval: float = typer.Option(60.0, "--pulse-interval", help="Seconds between pulses of primary journals."),
    spool_low_water: int = typer.Option(0, "--spool-low-water", help="Refuse appends (SPOOL_FULL) while the spool filesystem has fewer free bytes than this; 0: only when a write fails with ENOSPC."),
    max_unpersisted: int = typer.Option(0, "--max-unpersisted", help="Refuse appends (SPOOL_FULL) while this member holds more bytes not yet in the fragment store (backpressure while the store is down); 0: no bound."),
    no_allocator: bool = typer.Option(False, "--no-allocator", help="Do not run the allocator here."),
    log_format: Optional[str] = typer.Option(None, "--log-format", help="auto | json | console."),
    log_level: Optional[str] = typer.Option(None, "--log-level"),
    auth_keys_file: Optional[str] = typer.Option(None, "--auth-keys-file", help="Token signing keys, one base64 key per line (chmod 600); auth is on when keys are configured (also QUIRE_AUTH_KEYS)."),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help="Serve TLS with this PEM certificate (also QUIRE_TLS_CERT)."),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help="PEM private key of --tls-cert."),
    tls_ca: Optional[str] = typer.Option(None, "--tls-ca", help="PEM CA bundle peers are verified by."),
    tls_client_auth: Optional[bool] = typer.Option(None, "--tls-client-auth/--no-tls-client-auth", help="Require client certificates (mTLS) on every connection."),
) -> None:
    from protocol.config import load_settings
    from protocol.logs import configure_logging

    from .server import Server, ServerConfig

    s = load_settings({"zone": zone, "broker_id": id, "listen": listen, "etcd_url": etcd,
                       "etcd_root": root, "spool_dir": spool_dir, "redis_url": redis,
                       "journal_limit": journal_limit,
                       "lease_ttl_seconds": int(lease_ttl) if lease_ttl is not None else None,
                       "min_append_rate": min_append_rate,
                       "log_format": log_format, "log_level": log_level,
                       "auth_keys_file": auth_keys_file, "tls_cert": tls_cert, "tls_key": tls_key,
                       "tls_ca": tls_ca, "tls_client_auth": tls_client_auth})
    configure_logging(s.log_format, s.log_level, count_errors=True)
    advertise = _checked_endpoint(advertise)
    if advertise is None and _wildcard(s.listen.rpartition(":")[0]):
        # Peers and clients dial what we announce: "every interface" is no address.
        raise typer.BadParameter(f"{s.listen} listens on every interface, which peers and "
                                 "clients cannot dial; give --advertise host:port with this "
                                 "host's own address", param_hint="--listen")
    keyring, server_ssl, peer_ssl = _security(s)
    cfg = ServerConfig(zone=s.zone, suffix=s.broker_id, listen=s.listen, etcd_url=s.etcd_url,
                       root=s.etcd_root, spool_dir=s.spool_dir,
                       redis_url=redis,  # only when asked: without it appends and reads still work
                       journal_limit=s.journal_limit,
                       lease_ttl=lease_ttl if lease_ttl is not None else float(s.lease_ttl_seconds),
                       min_append_rate=float(s.min_append_rate), pulse_interval=pulse_interval,
                       drain_timeout=drain_timeout, run_allocator=not no_allocator,
                       spool_low_water=spool_low_water, max_unpersisted=max_unpersisted,
                       advertise=advertise,
                       keyring=keyring, server_ssl=server_ssl, peer_ssl=peer_ssl)
    persister = None
    if redis:
        from protocol.redis_security import sign_published_tasks

        # With auth on, the persist tasks this coordinator sends are signed (workers
        # refuse unsigned ones: docs/security.md).
        sign_published_tasks(keyring.task_keys() if keyring is not None else None)
        persister = _celery_persister(redis)
    if metrics_port:
        from .metrics import serve

        serve(metrics_port, metrics_addr)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    server_holder: list = []
    tune_gc_for_server()  # (protocol/runtime.py: the start-up heap is never rescanned)
    tune_malloc_for_server()  # (and frame-sized buffers reuse the heap's pages)

    async def main() -> None:
        server = Server(cfg, persister)
        server_holder.append(server)
        await server.run()

    runner(main())


def _security(s):  # noqa: ANN001, ANN202
    """Keyring (None: auth off) and the TLS contexts (None: plain TCP) from settings."""
    from protocol.credentials import settings_keyring
    from protocol.errors import ValidationError
    from protocol.logs import get_logger
    from protocol.tls import client_context, server_context

    try:
        keyring = settings_keyring(s)
        server_ssl = peer_ssl = None
        if s.tls_cert:
            if not s.tls_key:
                raise ValidationError("tls_key", "--tls-cert needs --tls-key")
            server_ssl = server_context(s.tls_cert, s.tls_key, s.tls_ca, s.tls_client_auth)
            from .metrics import watch_cert

            watch_cert("server", s.tls_cert)  # quire_tls_cert_expiry_timestamp_seconds
            watch_cert("ca", s.tls_ca)
            # Peers serve TLS too: verify them by the CA, present our certificate (mTLS).
            peer_ssl = client_context(s.tls_ca, s.tls_cert, s.tls_key) if s.tls_ca else None
            if peer_ssl is None:
                raise ValidationError("tls_ca", "a TLS coordinator needs --tls-ca to verify its peers")
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    get_logger(__name__).info("security", auth="on" if keyring else "off",
                              tls="mtls" if s.tls_client_auth and server_ssl else
                              "on" if server_ssl else "off")
    return keyring, server_ssl, peer_ssl


def _celery_persister(redis_url: str):  # noqa: ANN202
    """Closed fragments go to the Celery persist workers (coordinator/persister.py)."""
    from .persister import CeleryPersister

    holder: dict = {}

    def endpoints(fragment):  # noqa: ANN001, ANN202
        server = holder.get("server")
        if server is None or server.keyspace is None:
            return []
        res = server.topology.resolver.resolve_now(fragment.journal)
        me = server.cfg.endpoint
        return [me] + [e for e in res.route.endpoints if e and e != me]

    def store_for(journal):  # noqa: ANN001, ANN202
        server = holder.get("server")
        entry = server.keyspace.journals.get(journal) if server and server.keyspace else None
        return entry.spec.fragment.stores[0] if entry and entry.spec.fragment.stores else None

    def is_primary(journal):  # noqa: ANN001, ANN202
        server = holder.get("server")
        return bool(server and server.keyspace and server.topology.resolver.resolve_now(journal).is_primary)

    def opened_at(fragment):  # noqa: ANN001, ANN202 - called as the spool rolls it
        server = holder.get("server")
        r = server.replicas.get(fragment.journal) if server is not None else None
        f = r.spool.fragment if r is not None else None
        if f is not None and (f.begin, f.end) == (fragment.begin, fragment.end):
            return r.spool.first_append_time or None
        return None

    def backlog():  # noqa: ANN202
        from .backlog import journal_backlog

        server = holder.get("server")
        return {} if server is None or server.keyspace is None else journal_backlog(server, p)

    def routes():  # noqa: ANN202
        from .backlog import route_gaps

        server = holder.get("server")
        return {} if server is None or server.keyspace is None else route_gaps(server)

    p = CeleryPersister(redis_url, endpoints=endpoints, store_for=store_for, is_primary=is_primary,
                        opened_at=opened_at, backlog=backlog, routes=routes)
    p._quire_holder = holder  # the server registers itself below (see Server.__init__)
    return p


command.__doc__ = "Run a coordinator (journal broker) process."


def _checked_endpoint(value: Optional[str]) -> Optional[str]:
    """`host:port` or None; anything else is a usage error naming the flag."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"expected host:port, got {value!r}", param_hint="--advertise")
    if _wildcard(host):
        raise typer.BadParameter(f"{value} is no address peers can dial; give this host's own",
                                 param_hint="--advertise")
    return value


def _wildcard(host: str) -> bool:
    """True for a bind-everything host (empty, 0.0.0.0, ::)."""
    return host.strip("[]") in ("", "0.0.0.0", "::")


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

