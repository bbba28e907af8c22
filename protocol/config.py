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

from .discovery import default_data_dir, discover

__all__ = ["ConfigError", "Secret", "Settings", "load_settings", "default_data_dir"]

ENV_PREFIX = "QUIRE_"


class ConfigError(ValueError):
    """A setting has a bad value, or a config file is malformed."""


class Secret:
    """A string that does not print. `reveal()` is the only way to read it, so a
    settings object can be logged, repr'd or put in an exception safely."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)


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


# -- value parsers: each returns the typed value or raises ValueError(expected)


def _text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError("expected a string")
    return str(value).strip()


def _http_url(value: Any) -> str:
    s = _text(value)
    u = urlsplit(s)
    try:
        ok = u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 1) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError("expected an http(s) URL like http://127.0.0.1:2379")
    return s.rstrip("/")


def _http_urls(value: Any) -> str:
    """One http(s) URL, or several comma-separated with one scheme (an etcd cluster)."""
    parts = [p.strip() for p in _text(value).split(",") if p.strip()]
    if not parts:
        raise ValueError("expected an http(s) URL like http://127.0.0.1:2379")
    try:
        urls = [_http_url(p) for p in parts]
    except ValueError:
        raise ValueError("expected http(s) URLs like http://etcd-a:2379,http://etcd-b:2379"
                         if len(parts) > 1 else "expected an http(s) URL like http://127.0.0.1:2379"
                         ) from None
    if len({u.split("://")[0] for u in urls}) > 1:
        raise ValueError("expected one scheme for every URL, not both http:// and https://")
    return ",".join(urls)


def _etcd_root(value: Any) -> str:
    s = _text(value).rstrip("/")
    if not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", s):
        raise ValueError("expected an absolute key prefix like /quire")
    return s


def _redis_url(value: Any) -> str:
    s = _text(value)
    if urlsplit(s).scheme not in ("redis", "rediss", "unix"):
        raise ValueError("expected a URL like redis://127.0.0.1:6379/0")
    return s


def _store_url(value: Any) -> str:
    s = _text(value)
    u = urlsplit(s)
    if u.scheme == "file" and u.path.startswith("/") and not u.netloc:
        return s if s.endswith("/") else s + "/"
    if u.scheme == "s3" and re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", u.netloc or ""):
        return s if s.endswith("/") else s + "/"
    raise ValueError("expected file:///absolute/dir/ or s3://bucket/prefix/")


def _brokers(value: Any) -> str:
    parts = [p.strip() for p in _text(value).split(",") if p.strip()]
    if not parts:
        raise ValueError("expected host:port[,host:port...] like 127.0.0.1:8080")
    for part in parts:
        try:
            _hostport(part)
        except ValueError:
            raise ValueError("expected host:port[,host:port...] like 127.0.0.1:8080") from None
    return ",".join(parts)


def _endpoint(value: Any) -> str:
    s = _text(value)
    expected = "expected host:port or an http(s) URL like http://127.0.0.1:9000"
    if "://" in s:
        try:
            return _http_url(s)
        except ValueError:
            raise ValueError(expected) from None
    if re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", s):
        return s
    raise ValueError(expected)


def _secret(value: Any) -> Secret:
    if isinstance(value, Secret):
        return value
    s = _text(value)
    if not s:
        raise ValueError("expected a non-empty string")
    return Secret(s)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = _text(value).lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _dir(value: Any) -> str:
    s = _text(value)
    if not s:
        raise ValueError("expected a directory path")
    return str(Path(s).expanduser().absolute())


def _file(value: Any) -> str:
    s = _text(value)
    if not s:
        raise ValueError("expected a file path")
    return str(Path(s).expanduser().absolute())


def _token(value: Any) -> str:
    s = _text(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", s):
        raise ValueError("expected a name of letters, digits, '.', '_' or '-'")
    return s


def _hostport(value: Any) -> str:
    s = _text(value)
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("expected host:port like 127.0.0.1:8080")
    return s


def _int(minimum: int, expected: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(expected)
        try:
            n = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError(expected) from None
        if n < minimum:
            raise ValueError(expected)
        return n

    return parse


def _choice(*choices: str, upper: bool = False) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        s = _text(value)
        s = s.upper() if upper else s.lower()
        if s not in choices:
            raise ValueError("expected one of " + "|".join(choices))
        return s

    return parse


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "broker": _brokers,
    "etcd_url": _http_urls,
    "etcd_root": _etcd_root,
    "etcd_ca": _file,
    "etcd_cert": _file,
    "etcd_key": _file,
    "redis_url": _redis_url,
    "store_url": _store_url,
    "s3_endpoint": _endpoint,
    "s3_access_key": _text,
    "s3_secret_key": _secret,
    "s3_region": _token,
    "s3_secure": _bool,
    "data_dir": _dir,
    "spool_dir": _dir,
    "zone": _token,
    "broker_id": _token,
    "listen": _hostport,
    "journal_limit": _int(1, "expected a positive integer"),
    "lease_ttl_seconds": _int(1, "expected a positive number of seconds"),
    "min_append_rate": _int(0, "expected a number of bytes per second (0 disables)"),
    "log_format": _choice("auto", "json", "console"),
    "log_level": _choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True),
    "auth_keys": _secret,
    "auth_keys_file": _file,
    "auth_audience": _token,
    "token": _secret,
    "token_file": _file,
    "tls_cert": _file,
    "tls_key": _file,
    "tls_ca": _file,
    "tls_client_auth": _bool,
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
