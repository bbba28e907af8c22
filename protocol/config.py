"""Typed settings for every quire process.

Precedence, highest first: explicit overrides (CLI flags), `QUIRE_*`
environment variables, a YAML file (`QUIRE_CONFIG` or an explicit path),
the standard `AWS_*` variables (for S3 only), then defaults. The AWS variables
rank below the file because they are ambient credentials shared by every tool
on the machine, while anything that names quire was meant for quire.

Every value is validated here, once, with an error that names where it came
from (`QUIRE_LEASE_TTL_SECONDS: expected ...`), so no role has to second-guess
its settings.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import yaml

from . import config_values as v
from .config_values import Secret
from .discovery import default_data_dir, discover

__all__ = ["ConfigError", "Secret", "Settings", "load_settings", "default_data_dir"]

ENV_PREFIX = "QUIRE_"


class ConfigError(ValueError):
    """A setting has a bad value, or a config file is malformed."""


def _default_broker_id() -> str:
    # The hostname is what Gazette uses as a member suffix: stable across
    # restarts of the same machine, unique within a zone in practice.
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "broker"


_DEFAULT_DATA = default_data_dir()


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    broker: str = "127.0.0.1:8080"
    """Coordinator endpoints clients dial, host:port[,host:port...] (QUIRE_BROKER)."""
    etcd_url: str = "http://127.0.0.1:2379"
    """One etcd member's client URL, or several comma-separated (a cluster: clients
    fail over between them); https:// with etcd_ca."""
    etcd_root: str = "/quire"
    etcd_ca: str | None = None
    """PEM CA that etcd's server certificates chain to (https:// endpoints)."""
    etcd_cert: str | None = None
    """PEM client certificate presented to etcd; its common name is the etcd user."""
    etcd_key: str | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    store_url: str = (_DEFAULT_DATA / "fragments").as_uri() + "/"
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: Secret | None = None
    s3_region: str = "us-east-1"
    s3_secure: bool = True
    data_dir: str = str(_DEFAULT_DATA)
    spool_dir: str = str(_DEFAULT_DATA / "spool")
    zone: str = "local"
    broker_id: str = msgspec.field(default_factory=_default_broker_id)
    listen: str = "127.0.0.1:8080"
    journal_limit: int = 1024
    lease_ttl_seconds: int = 20
    min_append_rate: int = 65536
    log_format: str = "auto"
    log_level: str = "INFO"
    auth_keys: Secret | None = None
    """Comma-separated base64 HS256 keys: the first signs, any verifies (docs/security.md).
    Set on coordinators, auth is on; unset, it is off."""
    auth_keys_file: str | None = None
    """A file (mode 0600) holding the keys, one per line; read when auth_keys is unset."""
    auth_audience: str = "quire"
    token: Secret | None = None
    """The capability token this process presents (QUIRE_TOKEN)."""
    token_file: str | None = None
    """A file holding the token, re-read when it changes (QUIRE_TOKEN_FILE); used when
    `token` is unset."""
    tls_cert: str | None = None
    """PEM certificate (chain) a coordinator serves TLS with, and presents to peers."""
    tls_key: str | None = None
    tls_ca: str | None = None
    """PEM CA bundle clients and peers verify coordinators by; on coordinators, also the
    CA peer (client) certificates must chain to when tls_client_auth is on."""
    tls_client_auth: bool = False
    """Coordinators require a client certificate (mTLS) on every connection."""

    @property
    def etcd_host_port(self) -> tuple[str, int]:
        """The first etcd endpoint's host and port."""
        u = urlsplit(self.etcd_url.split(",")[0])
        return u.hostname or "127.0.0.1", u.port or 2379

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def s3_host(self) -> str | None:
        """The endpoint as host[:port], the form the minio client takes."""
        if self.s3_endpoint is None:
            return None
        return urlsplit(self.s3_endpoint).netloc if "://" in self.s3_endpoint else self.s3_endpoint

    def redacted(self) -> dict[str, Any]:
        """Every setting as plain data, secret masked; safe to log or print."""
        out = msgspec.structs.asdict(self)
        for key in ("s3_secret_key", "auth_keys", "token"):
            if out[key] is not None:
                out[key] = "********"
        return out


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "broker": v.brokers,
    "etcd_url": v.http_urls,
    "etcd_root": v.etcd_root,
    "etcd_ca": v.file,
    "etcd_cert": v.file,
    "etcd_key": v.file,
    "redis_url": v.redis_url,
    "store_url": v.store_url,
    "s3_endpoint": v.endpoint,
    "s3_access_key": v.text,
    "s3_secret_key": v.secret,
    "s3_region": v.token,
    "s3_secure": v.boolean,
    "data_dir": v.directory,
    "spool_dir": v.directory,
    "zone": v.token,
    "broker_id": v.token,
    "listen": v.hostport,
    "journal_limit": v.integer(1, "expected a positive integer"),
    "lease_ttl_seconds": v.integer(1, "expected a positive number of seconds"),
    "min_append_rate": v.integer(0, "expected a number of bytes per second (0 disables)"),
    "log_format": v.choice("auto", "json", "console"),
    "log_level": v.choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True),
    "auth_keys": v.secret,
    "auth_keys_file": v.file,
    "auth_audience": v.token,
    "token": v.secret,
    "token_file": v.file,
    "tls_cert": v.file,
    "tls_key": v.file,
    "tls_ca": v.file,
    "tls_client_auth": v.boolean,
}
assert set(_PARSERS) == set(Settings.__struct_fields__), "every setting needs a parser"

# Standard AWS variables, in order of preference, as fallbacks for S3.
_AWS_FALLBACKS: dict[str, tuple[str, ...]] = {
    "s3_endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "s3_access_key": ("AWS_ACCESS_KEY_ID",),
    "s3_secret_key": ("AWS_SECRET_ACCESS_KEY",),
    "s3_region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}


def _parse(key: str, value: Any, source: str) -> Any:
    try:
        return _PARSERS[key](value)
    except ValueError as exc:
        shown = "<hidden>" if key in ("s3_secret_key", "auth_keys", "token") else repr(value)
        raise ConfigError(f"{source}: {exc}, got {shown}") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: expected a mapping of setting: value")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = str(k).replace("-", "_")
        if key not in _PARSERS:
            raise ConfigError(f"config file {path}: unknown key {k!r}")
        if v is not None:
            out[key] = _parse(key, v, f"config file {path}: {k}")
    return out


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> Settings:
    """Build validated `Settings`.

    `overrides` holds CLI values keyed by setting name (None means "not
    given", so CLI options can be passed through unfiltered). `env` defaults to
    `os.environ`. `config_path` wins over `QUIRE_CONFIG`. Lowest of all, above the
    defaults: what a running `quire up` in the data dir offers (protocol.discovery).
    """
    env = os.environ if env is None else env
    layers: list[dict[str, Any]] = []  # lowest precedence first

    found = discover(env)
    layers.append({key: _parse(key, found[var], f"{var} (discovered)")
                   for key in _PARSERS if (var := ENV_PREFIX + key.upper()) in found})

    layers.append(
        {
            key: _parse(key, env[var], var)
            for key, names in _AWS_FALLBACKS.items()
            for var in reversed(names)  # earlier names win: applied last
            if env.get(var)
        }
    )

    path = config_path if config_path is not None else env.get(ENV_PREFIX + "CONFIG")
    if path:
        layers.append(_read_yaml(Path(path).expanduser()))

    from_env: dict[str, Any] = {}
    for key in _PARSERS:
        var = ENV_PREFIX + key.upper()
        if var in env and env[var] != "":
            from_env[key] = _parse(key, env[var], var)
    layers.append(from_env)

    from_cli: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if key not in _PARSERS:
            raise ConfigError(f"unknown setting {key!r}")
        if value is not None:
            from_cli[key] = _parse(key, value, key)
    layers.append(from_cli)

    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)

    # Paths derived from data_dir follow it unless set themselves, so moving
    # the data dir moves everything under it.
    data_dir = Path(merged.get("data_dir") or default_data_dir(env)).absolute()
    merged.setdefault("data_dir", str(data_dir))
    merged.setdefault("spool_dir", str(data_dir / "spool"))
    merged.setdefault("store_url", (data_dir / "fragments").as_uri() + "/")
    # An endpoint URL says whether TLS is on; s3_secure only needs setting for
    # a bare host:port.
    endpoint = merged.get("s3_endpoint")
    if endpoint and "://" in endpoint and "s3_secure" not in merged:
        merged["s3_secure"] = endpoint.startswith("https://")
    return Settings(**merged)
