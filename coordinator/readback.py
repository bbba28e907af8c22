"""Reading a closed fragment back for the persist workers, and what a copy that cannot
be read back means.

A persist worker streams a closed fragment from a replica (FetchFragment,
read_api.serve_fetch) and uploads it; the upload completes only if the bytes have the
fragment's length and SHA-1 (fragment_store.persist), so a wrong byte never becomes
an object. That check alone would leave this member holding a bad copy: it would
serve it to every worker that asks first (each upload failing, the task retrying
against the same copy) and to readers, and count it as unpersisted content forever.

So before a fragment is handed out, its file is read back whole here (on a thread: a
fragment may be large) and checked: exactly `end - begin` bytes whose SHA-1 is the
fragment's sum. A copy that is short (truncated), has other bytes (a flipped byte) or
cannot be read (EIO) is **lost locally**: the worker is answered "not here" (it asks
the next replica of the route, from the first byte), and the copy is dropped —

* out of the replica's closed local fragments, so reads of its offsets are served by
  the peers that hold good copies (read_api's gap fill) or, once persisted, the store;
* its file unlinked (never recycled as a spool file), so its room returns;
* untracked by this member's persister (the peers' copies are theirs to send);
* counted in `quire_fragment_readback_failures_total{reason}` (length, checksum, eio,
  erofs, other) and logged at error level naming the fragment's key.

A read error or a short read while streaming (the file changed after the check) drops
the copy the same way and closes the connection without the end-of-content frame, so
the worker never takes the stream as whole.
"""

from __future__ import annotations

import asyncio
import hashlib

from fragment_store.keys import fragment_key
from protocol.logs import get_logger

from . import metrics
from .spool_health import reason_of

__all__ = ["check_copy", "lose_copy"]

log = get_logger(__name__)

CHUNK = 1 << 20


def _read_back(file, size: int) -> tuple[int, str]:  # noqa: ANN001 - a SpoolFile
    """(bytes read, their SHA-1) of the file's first `size` bytes (and a byte more, so
    a file longer than its fragment is seen)."""
    sha, pos = hashlib.sha1(), 0
    while pos <= size:
        data = file.read_at(pos, min(CHUNK, size + 1 - pos))
        if not data:
            break
        sha.update(data)
        pos += len(data)
    return pos, sha.hexdigest()


async def check_copy(broker, replica, lf) -> str:  # noqa: ANN001
    """"" if `lf` (a LocalFragment of `replica`) reads back whole and matches its sum;
    else why not, after dropping it as lost (lose_copy)."""
    frag, size = lf.fragment, lf.fragment.end - lf.fragment.begin
    try:
        n, digest = await asyncio.to_thread(_read_back, lf.file, size)
    except OSError as exc:
        if lf not in replica.local:
            return "released while it was read back"
        lose_copy(broker, replica, lf, reason_of(exc), f"{type(exc).__name__}: {exc}")
        return f"its file cannot be read ({exc})"
    if lf not in replica.local:
        return "released while it was read back"  # (persisted and dropped meanwhile)
    if n != size:
        lose_copy(broker, replica, lf, "length", f"{n} bytes on disk, the fragment has {size}")
        held = f"{n} of" if n < size else "more than"
        return f"its file holds {held} {size} bytes"
    if digest != frag.sum:
        lose_copy(broker, replica, lf, "checksum", f"SHA-1 {digest} != {frag.sum}")
        return f"its content's SHA-1 is {digest}, not {frag.sum}"
    return ""


def lose_copy(broker, replica, lf, reason: str, detail: str) -> None:  # noqa: ANN001
    """Drop `lf` from `replica` as lost on this member (see the module docstring)."""
    if lf not in replica.local:
        return
    replica.local = [x for x in replica.local if x is not lf]
    if lf.file is not None:
        lf.file.discard(recycle=False)
    forget = getattr(broker.persister, "forget_fragment", None)
    if forget is not None:
        forget(lf.fragment)
    metrics.READBACK_FAILURES.labels(reason).inc()
    log.error("closed fragment cannot be read back: its copy here is lost, peers or the "
              "store serve it", journal=lf.fragment.journal, fragment=fragment_key(lf.fragment),
              reason=reason, error=detail)
    replica.wake()
