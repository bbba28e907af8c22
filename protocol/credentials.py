"""Where keys and tokens come from: files and settings (the IO beside protocol/auth.py,
which stays pure).

    load_keyring(keys, keys_file)   the coordinators' keyring (None: auth off); a keys file
                                    must be chmod 600
    TokenFile(path)                 a token re-read when its file changes, so a long-running
                                    process can have its token rotated without a restart
    settings_keyring / settings_token   the same from protocol.config.Settings
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .auth import DEFAULT_AUDIENCE, Keyring
from .errors import ValidationError

__all__ = ["TokenFile", "TokenSource", "current_token", "load_keyring", "settings_keyring",
           "settings_token", "unverified_expiry"]


def load_keyring(keys: str | None, keys_file: str | None,
                 audience: str = DEFAULT_AUDIENCE) -> Keyring | None:
    """The keyring from settings (auth_keys, else auth_keys_file), or None: auth off.
    A keys file must not be readable by group or others (like ssh keys)."""
    if keys:
        return Keyring.from_text(keys, audience)
    if keys_file:
        import os
        import stat

        try:
            st = os.stat(keys_file)
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValidationError("auth_keys_file", f"{keys_file} is readable by group or "
                                                        "others; chmod 600 it")
            with open(keys_file, encoding="ascii") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValidationError("auth_keys_file", f"{keys_file}: {exc}") from None
        return Keyring.from_text(text, audience)
    return None


def settings_keyring(settings: Any) -> Keyring | None:
    """load_keyring over a protocol.config.Settings."""
    keys = settings.auth_keys.reveal() if settings.auth_keys is not None else None
    return load_keyring(keys, settings.auth_keys_file, settings.auth_audience)


class TokenFile:
    """A token read from a file, re-read whenever the file changes: a long-running
    process presents the current one at each new connection, so rotating its token is
    rewriting the file (QUIRE_TOKEN_FILE). Calling it returns the token ("" if unreadable)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        import os

        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
            if stamp != self._stamp:
                with open(self.path, encoding="ascii") as f:
                    self._token = f.read().strip()
                self._stamp = stamp
        except (OSError, UnicodeDecodeError):
            self._token, self._stamp = "", None
        return self._token

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r})"


TokenSource = str | Callable[[], str]
"""What a client presents: a token, or a callable giving the current one (TokenFile)."""


def current_token(source: TokenSource) -> str:
    return source() if callable(source) else source


def unverified_expiry(token: str) -> float | None:
    """A token's `exp`, read *without* verifying it — only so a client can retire a pooled
    connection before the coordinator refuses it; never a basis for any decision about
    access. None if there is no token or it has no readable `exp`."""
    if not token:
        return None
    import jwt

    try:
        exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    except jwt.InvalidTokenError:
        return None
    return float(exp) if isinstance(exp, int | float) else None


def settings_token(settings: Any, explicit: str | None = None) -> TokenSource:
    """The token to present: an explicit one (a --token flag), else QUIRE_TOKEN, else a
    TokenFile of QUIRE_TOKEN_FILE, else none ("")."""
    if explicit:
        return explicit
    if settings.token is not None:
        return settings.token.reveal()
    if getattr(settings, "token_file", None):
        return TokenFile(settings.token_file)
    return ""
