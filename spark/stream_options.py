"""Options of a streaming read: the batch read's options (spark.options) plus the
ones only a stream has, parsed once on the driver into a picklable `StreamOptions`.

    brokers             coordinator endpoints (host:port, comma-separated); without them
                        the stream follows the persisted index only (store-only mode)
    startingOffsets     earliest (default) | latest | {"journal": offset, ...}
    maxBytesPerTrigger  soft cap on the bytes of one micro-batch (over all journals)

`begin`/`end` belong to batch reads: a stream's range is its offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .offsets import parse_offsets
from .options import OptionError, ReadOptions, parse_options

STREAM_ONLY = {"brokers", "endpoints", "startingoffsets", "maxbytespertrigger"}


@dataclass(frozen=True)
class StreamOptions:
    read: ReadOptions
    brokers: tuple[str, ...] = ()
    starting: dict[str, int] | str = "earliest"
    max_bytes: int | None = None


def split_endpoints(text: str, option: str = "brokers") -> tuple[str, ...]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OptionError(option, f"expected host:port, got {part!r}")
        out.append(part)
    return tuple(out)


def parse_stream_options(options: Mapping[str, Any]) -> StreamOptions:
    opts = {str(k).lower(): "" if v is None else str(v) for k, v in options.items()}
    for batch_only in ("begin", "end", "mode"):
        if batch_only in opts:
            raise OptionError(batch_only, "a batch read option; a stream reads from "
                                          "startingOffsets (earliest, latest or a JSON map)")
    read = parse_options({k: v for k, v in opts.items() if k not in STREAM_ONLY})
    brokers = split_endpoints(opts.get("brokers") or opts.get("endpoints", ""))
    starting = parse_offsets(opts.get("startingoffsets", "earliest") or "earliest")
    if isinstance(starting, dict) and read.selector == "":
        extra = sorted(set(starting) - set(read.journals))
        if extra:
            raise OptionError("startingOffsets", f"journal {extra[0]!r} is not one of the "
                                                 f"journals read ({', '.join(read.journals)})")
    raw_max = opts.get("maxbytespertrigger", "").strip()
    max_bytes = None
    if raw_max:
        try:
            max_bytes = int(raw_max, 0)
        except ValueError:
            raise OptionError("maxBytesPerTrigger", f"expected an integer, got {raw_max!r}") from None
        if max_bytes < 1:
            raise OptionError("maxBytesPerTrigger", f"{max_bytes} must be >= 1")
    return StreamOptions(read=read, brokers=brokers, starting=starting, max_bytes=max_bytes)
