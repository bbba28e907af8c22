"""coordinator/readback.py on real spool files: a closed fragment's file is read back
whole and checked before a persist worker gets it; a short, corrupt or longer copy is
dropped as lost (out of the replica, its file unlinked, untracked by the persister,
counted by reason), a whole one is kept. The cluster-level test with errfs (EIO) and a
real worker and store is tests/faults/test_readback.py."""

from __future__ import annotations

import hashlib
import os
import types

import pytest

from coordinator import metrics
from coordinator.readback import check_copy
from coordinator.replica import LocalFragment, Replica
from coordinator.spool import DiskFiles
from protocol import Fragment

J = "readback/j"


class Persister:
    def __init__(self) -> None:
        self.forgotten: list[Fragment] = []

    def forget_fragment(self, fragment: Fragment) -> None:
        self.forgotten.append(fragment)


def closed(files: DiskFiles, begin: int, data: bytes) -> LocalFragment:
    frag = Fragment(journal=J, begin=begin, end=begin + len(data),
                    sum=hashlib.sha1(data).hexdigest())
    f = files.create(J, begin)
    f.write_at(0, data)
    f.seal(frag)
    return LocalFragment(frag, f)


def failures(reason: str) -> float:
    return metrics.READBACK_FAILURES.labels(reason)._value.get()  # noqa: SLF001


@pytest.mark.parametrize("damage,reason", [("truncate", "length"), ("flip", "checksum"),
                                           ("extend", "length"), (None, "")])
async def test_a_copy_that_does_not_read_back_whole_is_lost_locally(
        tmp_path, damage: str | None, reason: str) -> None:  # noqa: ANN001
    files = DiskFiles(tmp_path)
    replica = Replica(J, files)
    data = os.urandom(3 << 20)  # more than one read-back chunk
    lf, other = closed(files, 0, data), closed(files, len(data), b"next\n")
    replica.local = [lf, other]
    path = lf.file.path
    if damage == "truncate":
        os.truncate(path, len(data) - 1)
    elif damage == "flip":
        with open(path, "r+b") as f:
            f.seek(2 << 20)
            f.write(bytes([data[2 << 20] ^ 0x80]))
    elif damage == "extend":
        with open(path, "ab") as f:
            f.write(b"!")
    persister = Persister()
    broker = types.SimpleNamespace(persister=persister)
    before = failures(reason) if reason else 0.0
    why = await check_copy(broker, replica, lf)
    if damage is None:
        assert why == "" and replica.local == [lf, other] and not persister.forgotten
        return
    assert why and replica.local == [other], why
    assert persister.forgotten == [lf.fragment]
    assert not os.path.exists(path) and not list((tmp_path / ".free").glob("*")), \
        "a lost copy's file is unlinked, never recycled"
    assert failures(reason) == before + 1
    # Dropped once: a second look at the same (released) copy changes nothing.
    assert await check_copy(broker, replica, lf)
    assert failures(reason) == before + 1
