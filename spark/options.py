"""Options of a quire read (Spark `.option(...)` strings, or Dask keyword arguments),
parsed once on the driver into a picklable `ReadOptions`. Every bad value raises
`OptionError`, whose message names the option."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol import LabelSelector, ValidationError, parse_selector, validate_journal_name
from protocol.discovery import effective_env
from protocol.spec import validate_store_url

from .planner import DEFAULT_MAX_SPAN_BYTES, DEFAULT_READ_PAST_FRAGMENTS

FRAMINGS = ("jsonl", "lines", "raw")
MODES = ("messages", "index")

_STORE_OPTIONS = {  # data source option -> open_store keyword
    "s3.endpoint": "endpoint",
    "s3.accesskey": "access_key",
    "s3.secretkey": "secret_key",
    "s3.sessiontoken": "session_token",
    "s3.region": "region",
    "s3.secure": "secure",
}
KNOWN = {"store", "path", "journal", "journals", "selector", "begin", "end", "framing", "mode",
         "maxspanbytes", "minspanbytes", "splitcompressed", "readpastfragments", "batchbytes",
         "etcd", "etcdroot", "etcdca", "etcdcert", "etcdkey", "index", "verify",
         "unverifiedreadsriskcorruption", "fallbackstores", *_STORE_OPTIONS}
INDEX_SOURCES = ("listing", "manifest")


class OptionError(ValidationError):
    """A read option is missing, unknown or malformed; `.path` is the option name."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"option {option!r}", reason)
        self.option = option


@dataclass(frozen=True)
class ReadOptions:
    store: str
    journals: tuple[str, ...] = ()
    selector: str = ""
    begin: int = 0
    end: int | None = None
    framing: str = "jsonl"
    mode: str = "messages"
    max_span_bytes: int = DEFAULT_MAX_SPAN_BYTES
    min_span_bytes: int = 0
    split_compressed: bool = False
    read_past_fragments: int = DEFAULT_READ_PAST_FRAGMENTS
    batch_bytes: int = 4 << 20
    index: str = "listing"
    verify: bool = True
    """Prove every fragment by its SHA-1 before a byte of it is framed (docs/integrity.md);
    off only with the option `unverifiedReadsRiskCorruption=true`."""
    fallback_stores: tuple[str, ...] = ()
    """Other stores holding copies of the fragments (option `fallbackStores`, comma
    separated; the journals' `fragment.stores`): a corrupt copy is read from these."""
    etcd: str = ""
    etcd_root: str = "/quire"
    etcd_tls: tuple[str, str, str] = ("", "", "")
    """(CA, client certificate, key) files for an `https://` etcd (options etcdCa,
    etcdCert, etcdKey; default QUIRE_ETCD_CA/CERT/KEY where the planner runs)."""
    store_options: dict[str, Any] = field(default_factory=dict)

    @property
    def label_selector(self) -> LabelSelector | None:
        return parse_selector(self.selector) if self.selector else None

    def plan_kwargs(self) -> dict[str, Any]:
        return dict(begin=self.begin, end=self.end, max_span_bytes=self.max_span_bytes,
                    min_span_bytes=self.min_span_bytes, split_compressed=self.split_compressed,
                    read_past_fragments=self.read_past_fragments)


def _int(opts: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip(), 0)
    except ValueError:
        raise OptionError(name, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(name, f"{value} must be >= {minimum}")
    return value


def _verify(opts: Mapping[str, str]) -> bool:
    """Verification is on unless unverifiedReadsRiskCorruption=true; the old `verify`
    option may only say true (a `verify=false` would silently risk corruption)."""
    if "verify" in opts and not _bool(opts, "verify", True):
        raise OptionError("verify", "fragments are always proven by their SHA-1; to read "
                                    "unproven bytes say unverifiedReadsRiskCorruption=true")
    return not _bool(opts, "unverifiedReadsRiskCorruption", False)


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise OptionError(name, f"expected true or false, got {raw!r}")


def parse_options(options: Mapping[str, Any]) -> ReadOptions:
    """Validate Spark/Dask options (names are case-insensitive; values strings or not)."""
    opts = {str(k).lower(): ("" if v is None else str(v) if not isinstance(v, str) else v)
            for k, v in options.items()}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise OptionError(unknown[0], f"unknown option (known: {', '.join(sorted(KNOWN))})")

    # Unset: $QUIRE_STORE_URL, else the store of a running `quire up` (protocol/discovery.py).
    store = opts.get("store") or opts.get("path") or effective_env().get("QUIRE_STORE_URL", "")
    if not store:
        raise OptionError("store", "required: the store URL, e.g. file:///data/ or s3://bucket/prefix/ "
                                   "(default $QUIRE_STORE_URL, or a running local cluster's)")
    if store.startswith("/"):
        store = "file://" + store
    if not store.endswith("/"):
        store += "/"
    try:
        validate_store_url(store, "store")
    except ValidationError as exc:
        raise OptionError("store", exc.reason) from None

    journals: list[str] = []
    for name in ("journal", "journals"):
        for part in opts.get(name, "").split(","):
            part = part.strip()
            if not part:
                continue
            try:
                validate_journal_name(part, name)
            except ValidationError as exc:
                raise OptionError(name, exc.reason) from None
            journals.append(part)
    selector = opts.get("selector", "").strip()
    if selector:
        try:
            parse_selector(selector)
        except ValidationError as exc:
            raise OptionError("selector", exc.reason) from None
    mode = opts.get("mode", "messages").strip().lower() or "messages"
    if mode not in MODES:
        raise OptionError("mode", f"expected one of {MODES}, got {mode!r}")
    if not journals and not selector:
        raise OptionError("journal", "give a journal name (or several, comma-separated) "
                                     "or a label selector with option 'selector'")
    framing = opts.get("framing", "jsonl").strip().lower() or "jsonl"
    if framing not in FRAMINGS:
        raise OptionError("framing", f"expected one of {FRAMINGS}, got {framing!r}")

    index = opts.get("index", "listing").strip().lower() or "listing"
    if index not in INDEX_SOURCES:
        raise OptionError("index", f"expected one of {INDEX_SOURCES}, got {index!r}")

    begin = _int(opts, "begin", 0)
    end = _int(opts, "end", None)
    assert begin is not None
    if end is not None and end < begin:
        raise OptionError("end", f"{end} is before begin ({begin})")

    store_options: dict[str, Any] = {}
    for opt, kw in _STORE_OPTIONS.items():
        if opt in opts and opts[opt] != "":
            store_options[kw] = _bool(opts, opt, True) if kw == "secure" else opts[opt]

    return ReadOptions(
        store=store, journals=tuple(dict.fromkeys(journals)), selector=selector,
        begin=begin, end=end, framing=framing, mode=mode,
        max_span_bytes=_int(opts, "maxSpanBytes", DEFAULT_MAX_SPAN_BYTES, 1) or 1,
        min_span_bytes=_int(opts, "minSpanBytes", 0) or 0,
        split_compressed=_bool(opts, "splitCompressed", False),
        read_past_fragments=_int(opts, "readPastFragments", DEFAULT_READ_PAST_FRAGMENTS) or 0,
        batch_bytes=_int(opts, "batchBytes", 4 << 20, 1 << 10) or (4 << 20),
        index=index, verify=_verify(opts),
        fallback_stores=tuple(u.strip() for u in opts.get("fallbackstores", "").split(",") if u.strip()),
        etcd=opts.get("etcd", "").strip(),
        etcd_root=(opts.get("etcdroot", "").strip() or "/quire").rstrip("/") or "/quire",
        etcd_tls=(opts.get("etcdca", "").strip(), opts.get("etcdcert", "").strip(),
                  opts.get("etcdkey", "").strip()),
        store_options=store_options,
    )
