"""`quire auth keygen`, `quire auth token`, `quire auth verify`: keys and capability tokens.

    quire auth keygen > keys && chmod 600 keys
    QUIRE_AUTH_KEYS_FILE=keys quire auth token --cap append,read --prefix team-a/ --ttl 1h

The token goes to stdout alone (so `export QUIRE_TOKEN=$(quire auth token …)` works);
it is never logged. See docs/security.md.
"""

from __future__ import annotations

import base64
import getpass
import os
from typing import Optional

import typer

from protocol.auth import Scope, parse_caps
from protocol.credentials import load_keyring
from protocol.config import load_settings
from protocol.spec import parse_duration

from .common import EXIT_INVALID, EXIT_NOT_ALLOWED, CliError

app = typer.Typer(help="Capability tokens: make signing keys and mint tokens.", no_args_is_help=True)


@app.command("keygen")
def keygen(size: int = typer.Option(32, "--bytes", min=32, max=128,
                                    help="Key size in bytes (HS256 needs at least 32).")) -> None:
    """Print a new random base64 signing key."""
    typer.echo(base64.b64encode(os.urandom(size)).decode())


@app.command("token")
def token(cap: str = typer.Option(..., "--cap", help="Capabilities, comma-separated: "
                                  "append, read, list, apply, replicate, shards."),
          prefix: list[str] = typer.Option([], "--prefix", help="A `/`-terminated journal "
                                            "prefix, an exact journal name, or `*` (repeatable)."),
          selector: Optional[str] = typer.Option(None, "--selector", help="A label selector "
                                                 "the journals must match, e.g. 'team=a'."),
          ttl: str = typer.Option("1h", "--ttl", help="Lifetime: 90s, 10m, 1h, 7d (at most 7d)."),
          subject: Optional[str] = typer.Option(None, "--subject", help="Who holds it "
                                                "(logged on refusals; default: your user name)."),
          keys_file: Optional[str] = typer.Option(None, "--keys-file", help="Signing keys file "
                                                  "(default: QUIRE_AUTH_KEYS / QUIRE_AUTH_KEYS_FILE).")) -> None:
    """Mint a token signed with the first configured key."""
    s = load_settings({"auth_keys_file": keys_file} if keys_file else None)
    keys = s.auth_keys.reveal() if s.auth_keys is not None and not keys_file else None
    ring = load_keyring(keys, s.auth_keys_file, s.auth_audience)
    if ring is None:
        raise CliError("no signing keys: set QUIRE_AUTH_KEYS, QUIRE_AUTH_KEYS_FILE or --keys-file "
                       "(make one with `quire auth keygen`)", EXIT_INVALID)
    scope = Scope.of(prefix, selector)
    seconds = parse_duration(ttl, "--ttl")
    typer.echo(ring.mint(parse_caps(cap), scope, seconds, subject or getpass.getuser()))


@app.command("verify")
def verify(token: Optional[str] = typer.Argument(None, help="The token (default $QUIRE_TOKEN)."),
           keys_file: Optional[str] = typer.Option(None, "--keys-file", help="Keys file "
                                                   "(default: QUIRE_AUTH_KEYS / QUIRE_AUTH_KEYS_FILE).")) -> None:
    """Check a token against the keys and print its claims as JSON (exit 5 if refused)."""
    import datetime as dt
    import json

    from protocol.auth import TokenError, cap_names

    s = load_settings({"auth_keys_file": keys_file} if keys_file else None)
    keys = s.auth_keys.reveal() if s.auth_keys is not None and not keys_file else None
    ring = load_keyring(keys, s.auth_keys_file, s.auth_audience)
    if ring is None:
        raise CliError("no keys: set QUIRE_AUTH_KEYS, QUIRE_AUTH_KEYS_FILE or --keys-file", EXIT_INVALID)
    text = token or (s.token.reveal() if s.token is not None else "")
    try:
        claims = ring.verify(text)
    except TokenError as exc:
        raise CliError(f"UNAUTHORIZED: {exc}", EXIT_NOT_ALLOWED) from None

    def when(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")

    typer.echo(json.dumps({"sub": claims.subject, "cap": cap_names(claims.caps),
                           "pfx": list(claims.scope.prefixes),
                           "sel": str(claims.scope.selector) if claims.scope.selector else None,
                           "iat": when(claims.issued_at), "exp": when(claims.expires_at)}))
