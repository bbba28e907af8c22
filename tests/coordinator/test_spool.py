"""Spool transitions: unit cases plus a hypothesis state machine over interleavings."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.spool import ContentDeltaMismatch, DiskFiles, MemoryFiles, Spool
from protocol import Codec, Fragment, LabelSet, ReplicateProposal, Status

J = "test/journal"


class Recorder:
    def __init__(self) -> None:
        self.commits: list[Fragment] = []
        self.closed: list[tuple[Fragment, bytes]] = []

    def on_commit(self, spool, fragment, primary):  # noqa: ANN001
        self.commits.append(fragment)

    def on_closed(self, spool, fragment, file, primary):  # noqa: ANN001
        data = file.read_at(0, fragment.end - fragment.begin) if file else b""
        self.closed.append((fragment, data))
        if file is not None:
            file.discard()


def sha(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()


def test_commit_rollback_and_offset_reuse() -> None:
    rec = Recorder()
    s = Spool(J, observer=rec)
    s.apply_content(0, b"hello ")
    s.apply_content(6, b"world")
    assert s.next() == Fragment(journal=J, begin=0, end=11, sum=sha(b"hello world"))
    assert s.apply_proposal(s.commit_proposal()).status == Status.OK
    assert rec.commits[-1].end == 11 and s.delta == 0
    # An aborted append: its bytes vanish and its offsets are re-used.
    s.apply_content(0, b"garbage")
    assert s.apply_proposal(s.rollback_proposal()).status == Status.OK
    s.apply_content(0, b"!")
    s.apply_proposal(s.commit_proposal())
    assert s.fragment.sum == sha(b"hello world!") and s.end == 12
    assert s.read_committed(0, 100) == b"hello world!"


def test_content_delta_must_match() -> None:
    s = Spool(J)
    s.apply_content(0, b"abc")
    with pytest.raises(ContentDeltaMismatch):
        s.apply_content(0, b"def")


def test_mismatch_returns_own_fragment_and_registers() -> None:
    regs = LabelSet.of({"owner": "a"})
    s = Spool(J, registers=regs)
    s.apply_content(0, b"abc")
    bogus = Fragment(journal=J, begin=0, end=3, sum=sha(b"xyz"))
    resp = s.apply_proposal(ReplicateProposal(proposal=bogus, registers=regs))
    assert resp.status == Status.PROPOSAL_MISMATCH
    assert resp.fragment == s.fragment and resp.registers == regs
    assert s.delta == 3  # a mismatch changes nothing


def test_roll_forward_closes_fragment_and_takes_registers() -> None:
    rec = Recorder()
    s = Spool(J, observer=rec)
    s.apply_content(0, b"abc")
    s.apply_proposal(s.commit_proposal())
    s.apply_content(0, b"uncommitted")
    regs = LabelSet.of({"k": "v"})
    resp = s.apply_proposal(s.roll_proposal(offset=100, codec=Codec.ZSTANDARD, registers=regs))
    assert resp.status == Status.OK
    assert rec.closed == [(Fragment(journal=J, begin=0, end=3, sum=sha(b"abc")), b"abc")]
    assert s.fragment == Fragment(journal=J, begin=100, end=100, codec=Codec.ZSTANDARD)
    assert s.registers == regs and s.delta == 0


def test_empty_roll_at_end_changes_codec_of_an_empty_spool() -> None:
    s = Spool(J)
    assert s.should_roll(1 << 20, Codec.GZIP, 0)
    assert s.apply_proposal(s.roll_proposal(codec=Codec.GZIP)).status == Status.OK
    assert s.fragment.codec == Codec.GZIP and s.end == 0
    s.apply_content(0, b"x")
    s.apply_proposal(s.commit_proposal())
    assert not s.should_roll(1 << 20, Codec.ZSTANDARD, 0)  # never cut short for a codec
    assert s.should_roll(1, Codec.GZIP, 0)


def test_flush_interval_buckets() -> None:
    now = [1000.0]
    s = Spool(J, clock=lambda: now[0])
    s.apply_content(0, b"x")
    s.apply_proposal(s.commit_proposal())
    assert not s.should_roll(1 << 20, Codec.NONE, 60.0)
    now[0] = 1081.0
    assert s.should_roll(1 << 20, Codec.NONE, 60.0)


def test_disk_files_seal_rename_and_recycle(tmp_path) -> None:  # noqa: ANN001
    files = DiskFiles(tmp_path, recycle=1)
    kept: list = []

    class Keep(Recorder):
        def on_closed(self, spool, fragment, file, primary):  # noqa: ANN001
            kept.append((fragment, file))

    s = Spool(J, files=files, observer=Keep())
    s.apply_content(0, b"0123456789")
    s.apply_proposal(s.commit_proposal())
    s.apply_proposal(s.roll_proposal())
    frag, f = kept[0]
    assert f.path.endswith(f"{0:016x}-{10:016x}-{sha(b'0123456789')}.raw")
    assert open(f.path, "rb").read() == b"0123456789"
    f.discard()  # recycled: the next spool file reuses it
    s.apply_content(0, b"ab")
    s.apply_proposal(s.commit_proposal())
    assert s.read_committed(10, 100) == b"ab"
    s.apply_proposal(s.roll_proposal())
    _, f2 = kept[1]
    assert open(f2.path, "rb").read() == b"ab"  # stale recycled bytes were cut off
    files.close()


class SpoolMachine(RuleBasedStateMachine):
    """A primary's spool drives a replica's spool; a model tracks what was committed."""

    def __init__(self) -> None:
        super().__init__()
        self.prec, self.rrec = Recorder(), Recorder()
        self.primary = Spool(J, observer=self.prec, files=MemoryFiles())
        self.replica = Spool(J, observer=self.rrec, files=MemoryFiles())
        self.pending = b""
        self.committed = b""  # every committed byte, in journal order (offset 0 onwards)
        self.gaps: list[tuple[int, int]] = []  # offsets skipped by rolls forward

    def send(self, prop: ReplicateProposal) -> None:
        a = self.primary.apply_proposal(prop, primary=True)
        b = self.replica.apply_proposal(prop)
        assert a.status == b.status == Status.OK, (a, b)

    @rule(data=st.binary(min_size=1, max_size=64))
    def chunk(self, data: bytes) -> None:
        delta = self.primary.delta
        self.primary.apply_content(delta, data)
        self.replica.apply_content(delta, data)
        self.pending += data

    @precondition(lambda self: self.pending)
    @rule()
    def commit(self) -> None:
        self.send(self.primary.commit_proposal())
        self.committed += self.pending
        self.pending = b""

    @rule()
    def rollback(self) -> None:
        self.send(self.primary.rollback_proposal())
        self.pending = b""

    # A primary rolls only with nothing in flight (at an append's start, or in a sync).
    @precondition(lambda self: not self.pending)
    @rule(skip=st.integers(min_value=0, max_value=5))
    def roll(self, skip: int) -> None:
        at = self.primary.end + skip
        self.send(self.primary.roll_proposal(offset=at))
        if skip:
            self.gaps.append((len(self.committed) + sum(e - b for b, e in self.gaps), at))
        self.pending = b""

    @rule(end=st.integers(min_value=0, max_value=300), data=st.binary(max_size=8))
    def bogus_proposal(self, end: int, data: bytes) -> None:
        frag = Fragment(journal=J, begin=self.replica.begin, end=max(end, self.replica.begin),
                        sum=sha(data) if data else "0" * 40)
        if frag.end > self.replica.end + self.replica.delta or frag.end == self.replica.end:
            return  # that would be a legal roll (or a rollback), not a bogus proposal
        if frag == self.replica.next() or frag == self.replica.fragment:
            return
        before = (self.replica.fragment, self.replica.delta)
        resp = self.replica.apply_proposal(ReplicateProposal(proposal=frag))
        assert resp.status == Status.PROPOSAL_MISMATCH
        assert (self.replica.fragment, self.replica.delta) == before

    @invariant()
    def replicas_agree_and_content_is_committed_appends(self) -> None:
        for spool, rec in ((self.primary, self.prec), (self.replica, self.rrec)):
            frags = [f for f, _ in rec.closed] + [spool.fragment]
            pieces = [d for _, d in rec.closed] + [spool.read_committed(spool.begin, 1 << 30)]
            for f, d in zip(frags, pieces):
                assert len(d) == f.end - f.begin
                assert f.sum == (sha(d) if d else "0" * 40)
            # Contiguous, increasing, never overlapping; gaps only where a roll skipped.
            for a, b in zip(frags, frags[1:]):
                assert a.end <= b.begin
            assert b"".join(pieces) == self.committed
        assert self.primary.fragment == self.replica.fragment
        assert self.primary.registers == self.replica.registers


TestSpoolMachine = SpoolMachine.TestCase
TestSpoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_retired_replica_keeps_committed_content_and_its_offset() -> None:
    """An assignment going away closes the spool for persistence (never drops it), and
    the replica keeps its offset for the next pipeline sync (docs/reliability.md #2)."""
    from protocol import ReplicateContent

    from coordinator.replica import Replica

    closed: list = []
    replica = Replica("j/retire", MemoryFiles(), lambda f, p, primary: closed.append((f, primary)))
    spool = replica.spool
    spool.apply(ReplicateContent(content_delta=0), b"hello world")
    assert spool.apply_proposal(spool.commit_proposal()).status == Status.OK
    spool.apply(ReplicateContent(content_delta=0), b"uncommitted")
    assert replica.retire() is True  # a closed fragment is held until persisted
    assert [(f.begin, f.end) for f, _ in closed] == [(0, 11)] and closed[0][1] is True
    assert spool.end == 11 and spool.delta == 0 and spool.content_length == 0
    frag, local = replica.lookup(0)
    assert replica.read_local(frag, local, 0, 100) == b"hello world"
    # A sync at an older offset is answered with our larger one (largest offset wins).
    resp = spool.apply_proposal(spool.roll_proposal(0))
    assert resp.status == Status.PROPOSAL_MISMATCH and resp.fragment.end == 11
    assert spool.end == 11


def test_drop_after_forgets_a_superseded_primarys_unacknowledged_commits() -> None:
    from protocol import ReplicateContent

    from coordinator.replica import Replica

    replica = Replica("j/drop", MemoryFiles())
    spool = replica.spool
    for data in (b"acked;", b"unacked"):
        spool.apply(ReplicateContent(content_delta=0), data)
        assert spool.apply_proposal(spool.commit_proposal(), primary=True).status == Status.OK
    replica.publish(6)  # the primary published only the acknowledged commit
    replica.drop_unacknowledged()
    assert (spool.begin, spool.end) == (0, 6)
    assert spool.fragment.sum == hashlib.sha1(b"acked;").hexdigest()
    assert spool.read_committed(0, 100) == b"acked;"
    # The next commit continues from the kept prefix with a consistent running SHA-1.
    spool.apply(ReplicateContent(content_delta=0), b"next")
    assert spool.next().sum == hashlib.sha1(b"acked;next").hexdigest()


def test_a_spool_file_makes_its_journals_directory_only_when_it_is_missing(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    files = DiskFiles(tmp_path / "spool", recycle=1)
    made: list[str] = []
    real = os.makedirs

    def makedirs(path, **kw):  # noqa: ANN001, ANN202 - (it recurses through the name)
        if str(path).endswith(("journal", "other")):
            made.append(str(path))
        return real(path, **kw)

    monkeypatch.setattr(os, "makedirs", makedirs)
    first = files.create("a/b/journal", 0)  # its first fragment: the directories are made
    first.write_at(0, b"one")
    first.flush()
    assert made == [str(tmp_path / "spool" / "a/b/journal")]
    second = files.create("a/b/journal", 3)  # a later one: none made
    assert made == [str(tmp_path / "spool" / "a/b/journal")]
    second.discard()  # (pooled: the next file is this one, renamed)
    shutil.rmtree(tmp_path / "spool" / "a")  # removed meanwhile: made again, file and pooled file alike
    third = files.create("a/b/journal", 9)
    third.write_at(0, b"three")
    third.flush()
    assert third.read_at(0, 5) == b"three" and len(made) == 2
    fourth = files.create("other", 0)
    assert fourth.path == str(tmp_path / "spool" / "other" / f"{0:016x}.spool") and len(made) == 3
    for f in (first, third, fourth):
        f.discard(recycle=False)
    files.close()


def test_a_hosted_journals_first_spool_file_is_its_spare(tmp_path) -> None:  # noqa: ANN001
    """The directory and a spare file are made on a thread when the journal is hosted
    (spool_spares.py); its first spool file is that spare, renamed; later ones are made."""
    from coordinator.spool_spares import SPARE
    from tools.services import wait_for

    files = DiskFiles(tmp_path / "spool")
    files.prepare("a/journal")
    files.prepare("a/journal")  # (twice: one spare)
    wait_for(files.spares.idle, timeout=10, what="the spare maker to finish")
    spare = tmp_path / "spool" / "a/journal" / SPARE
    assert spare.is_file() and spare.stat().st_size == 0 and files.spares.made == 1
    inode = spare.stat().st_ino
    s = Spool("a/journal", files=files)
    s.apply_content(0, b"first bytes")
    s.apply_proposal(s.commit_proposal())
    f = s.file
    assert f is not None and f.path == str(tmp_path / "spool" / "a/journal" / f"{0:016x}.spool")
    assert os.stat(f.path).st_ino == inode and not spare.exists()
    assert s.read_committed(0, 100) == b"first bytes"
    # A journal with no spare (not hosted through the host, or its spare not made yet)
    # makes its file as before.
    other = files.create("b/journal", 5)
    other.write_at(0, b"x")
    other.flush()
    assert other.read_at(0, 1) == b"x"
    # Recovery leaves a spare alone: it is neither an open spool nor a fragment.
    files.prepare("c/journal")
    wait_for(files.spares.idle, timeout=10, what="the spare maker to finish")
    from coordinator.recovery import scan_spool_dir
    assert scan_spool_dir(files, lambda j: None) == {}
    assert (tmp_path / "spool" / "c/journal" / SPARE).is_file()
    other.discard(recycle=False)
    files.close()
