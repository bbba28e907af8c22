"""ShardSpecs: field-named validation errors, and apply/list/delete/checkpoint against a
real etcd (library and `quire shards` CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import pytest

from protocol import LabelSet
from protocol.errors import EtcdTransactionFailed, ShardNotFound, ValidationError
from protocol.shard import ShardSource, ShardSpec
from tools.cli import shards as cli
from topology.etcd import connect
from topology.shards import (
    ShardChange,
    apply_shards,
    delete_shard,
    get_shard,
    list_shards,
    notice_key,
    request_checkpoint,
)


def good(**kw: object) -> ShardSpec:
    base: dict[str, object] = {"id": "counts-000",
                               "sources": (ShardSource(journal="clicks/part-000"),)}
    base.update(kw)
    return ShardSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "field"), [
    ({"id": "bad id"}, "id"),
    ({"id": "../x"}, "id"),
    ({"id": ""}, "id"),
    ({"sources": ()}, "sources"),
    ({"sources": (ShardSource(),)}, "sources[0]"),
    ({"sources": (ShardSource(journal="a/b", selector="x=y"),)}, "sources[0]"),
    ({"sources": (ShardSource(journal="/abs"),)}, "sources[0].journal"),
    ({"sources": (ShardSource(selector="a in ()"),)}, "sources[0].selector"),
    ({"sources": (ShardSource(journal="clicks/part-000", min_offset=-1),)}, "sources[0].min_offset"),
    ({"sources": (ShardSource(journal="clicks/p1"), ShardSource(journal="clicks/p1"))}, "sources[1]"),
    ({"recovery_log_prefix": "bad//prefix"}, "recovery_log_prefix"),
    ({"recovery_log_prefix": "clicks", "id": "part-000"}, "recovery_log_prefix"),
    ({"hot_standbys": -1}, "hot_standbys"),
    ({"hot_standbys": 9}, "hot_standbys"),
    ({"labels": LabelSet.of(name="x")}, "labels[0].name"),
    ({"checkpoint_interval": 0.0}, "checkpoint_interval"),
])
def test_bad_specs_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        good(**kw).validate()
    assert info.value.path == field, str(info.value)


def test_good_spec_and_recovery_log() -> None:
    spec = good(recovery_log_prefix="recovery/counts", hot_standbys=1)
    spec.validate()
    assert spec.recovery_log == "recovery/counts/counts-000"


def test_spec_file_errors_name_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        cli.parse("shards:\n  - id: a-1\n    sources: [{journal: xx/yy, min_offset: -3}]\n", "f.yaml")
    assert info.value.path == "f.yaml.shards[0].sources[0].min_offset"
    with pytest.raises(ValidationError) as info:
        cli.parse("shards:\n  - id: a-1\n    sources: [{journal: xx/yy}]\n    hot_standbys: many\n",
                  "f.yaml")
    assert info.value.path.startswith("f.yaml.shards[0].hot_standbys"), info.value.path
    with pytest.raises(ValidationError) as info:
        cli.parse("- id: a-1\n  sources: [xx/yy]\n  checkpoint_interval: soon\n", "f.yaml")
    assert info.value.path == "f.yaml[0].checkpoint_interval"
    with pytest.raises(ValidationError):
        cli.parse("shards: [{id: a-1, sources: [xx/yy]}, {id: a-1, sources: [xx/zz]}]", "f.yaml")


def test_spec_file_common_defaults() -> None:
    changes = cli.parse("common: {recovery_log_prefix: rec/c, checkpoint_interval: 250ms, "
                        "labels: {app: c}}\nshards:\n  - {id: c-1, sources: [jj/one], labels: {xx: yy}}\n"
                        "  - {id: c-2, delete: true, revision: 7}\n")
    assert changes[0].spec is not None
    assert changes[0].spec.recovery_log == "rec/c/c-1"
    assert changes[0].spec.checkpoint_interval == 0.25
    assert changes[0].spec.labels == LabelSet.of(app="c", xx="yy")
    assert changes[1] == ShardChange(delete="c-2", expect_mod_revision=7)


async def test_apply_list_delete_cas(etcd, etcd_root: str) -> None:  # noqa: ANN001
    client = await connect(etcd.url)
    try:
        a, b = good(id="s-a"), good(id="s-b", hot_standbys=1)
        rev = (await apply_shards(client, etcd_root, [ShardChange(spec=a, expect_mod_revision=0),
                                                      ShardChange(spec=b)])).revision
        assert rev > 0
        listed = await list_shards(client, etcd_root)
        assert [e.spec for e in listed] == [a, b]
        # Must-not-exist fails now, and the whole transaction with it (a spec equal to
        # the stored one would be left unchanged: nothing to write).
        with pytest.raises(EtcdTransactionFailed):
            await apply_shards(client, etcd_root, [
                ShardChange(spec=good(id="s-c")),
                ShardChange(spec=msgspec.structs.replace(a, hot_standbys=1), expect_mod_revision=0)])
        assert len(await list_shards(client, etcd_root)) == 2
        # A bad spec writes nothing.
        with pytest.raises(ValidationError) as info:
            await apply_shards(client, etcd_root, [ShardChange(spec=good(id="s-d")),
                                                   ShardChange(spec=good(id="s-e", hot_standbys=-2))])
        assert info.value.path == "[1].hot_standbys"
        assert len(await list_shards(client, etcd_root)) == 2
        # CAS on the mod revision.
        entry = await get_shard(client, etcd_root, "s-a")
        changed = msgspec.structs.replace(a, disable=True)
        await apply_shards(client, etcd_root, [ShardChange(spec=changed,
                                                           expect_mod_revision=entry.mod_revision)])
        with pytest.raises(EtcdTransactionFailed):
            await apply_shards(client, etcd_root, [ShardChange(spec=a,
                                                               expect_mod_revision=entry.mod_revision)])
        await request_checkpoint(client, etcd_root, "s-a")
        assert await client.get(notice_key(etcd_root, "s-a").encode()) is not None
        await delete_shard(client, etcd_root, "s-a")
        with pytest.raises(ShardNotFound):
            await delete_shard(client, etcd_root, "s-a")
        with pytest.raises(ShardNotFound):
            await request_checkpoint(client, etcd_root, "s-a")
        assert [e.spec.id for e in await list_shards(client, etcd_root)] == ["s-b"]
    finally:
        await client.close()


def _quire(etcd, root: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:  # noqa: ANN001
    """`quire shards …` in a subprocess: the real command, exit code and all."""
    env = {**os.environ, "QUIRE_ETCD_URL": etcd.url, "QUIRE_ETCD_ROOT": root, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "tools.cli.main", "shards", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=60)


class _Quick:
    """`quire shards …` in this process (the same main(); saves an interpreter start)."""

    def __init__(self, etcd, root: str, capsys, monkeypatch) -> None:  # noqa: ANN001
        monkeypatch.setenv("QUIRE_ETCD_URL", etcd.url)
        monkeypatch.setenv("QUIRE_ETCD_ROOT", root)
        self.capsys, self.monkeypatch = capsys, monkeypatch

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        import io

        from tools.cli.main import main

        if stdin is not None:
            self.monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        self.capsys.readouterr()
        code = main(["shards", *args])
        out = self.capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_cli_apply_list_delete(etcd, etcd_root: str, tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    spec_file = tmp_path / "shards.yaml"
    spec_file.write_text("common: {recovery_log_prefix: recovery/counts}\nshards:\n"
                         "  - {id: counts-000, sources: [{journal: clicks/part-000}]}\n"
                         "  - {id: counts-001, sources: [{selector: 'topic=clicks'}], hot_standbys: 1}\n")
    out = _quire(etcd, etcd_root, "apply", "-f", str(spec_file))  # one real process
    assert out.returncode == 0, out.stderr
    quire = _Quick(etcd, etcd_root, capsys, monkeypatch)
    out = quire("list", "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["counts-000", "counts-001"]
    assert rows[0]["state"] == "IDLE" and rows[0]["primary"] is None
    table = quire("list")
    assert "counts-001" in table.stdout and "IDLE" in table.stdout, table.stdout
    # yaml round-trips through apply (with revisions: a CAS).
    as_yaml = quire("list", "-o", "yaml").stdout
    assert "revision:" in as_yaml
    same = quire("apply", "-f", "-", stdin=as_yaml)  # what etcd holds already: no write
    assert same.returncode == 0 and "applied 0 shard change(s), 2 unchanged" in same.stdout
    edited = as_yaml.replace("hot_standbys: 1", "hot_standbys: 2")
    assert edited != as_yaml
    assert quire("apply", "-f", "-", stdin=edited).returncode == 0
    stale = quire("apply", "-f", "-", stdin=edited.replace("hot_standbys: 2", "hot_standbys: 0"))
    assert stale.returncode == 4, stale.stderr  # conflict: revisions moved
    bad = quire("apply", "-f", "-",
                 stdin="- {id: x-1, sources: [{journal: aa/bb}], hot_standbys: 99}\n")
    assert bad.returncode == 7 and "hot_standbys" in bad.stderr, bad.stderr
    assert quire("checkpoint", "counts-000").returncode == 0
    assert quire("delete", "counts-000").returncode == 0
    missing = quire("delete", "counts-000")
    assert missing.returncode == 3, missing.stderr
    rows = [json.loads(line) for line in quire("list", "-o", "json").stdout.splitlines()]
    assert [r["id"] for r in rows] == ["counts-001"]


async def test_guards_are_the_lowest_offset_any_shard_needs(etcd, etcd_root: str) -> None:  # noqa: ANN001
    from topology.shards import guard_key, publish_needs

    client = await connect(etcd.url)

    async def guard(journal: str) -> int:
        return int((await client.get(guard_key(etcd_root, journal).encode())).value)

    try:
        assert await publish_needs(client, etcd_root, "a", {"shared/j": 100, "rec/a": 7}) == \
            {"shared/j": 100, "rec/a": 7}
        await publish_needs(client, etcd_root, "b", {"shared/j": 50})
        assert await guard("shared/j") == 50
        await publish_needs(client, etcd_root, "a", {"shared/j": 200, "rec/a": 9})
        assert await guard("shared/j") == 50 and await guard("rec/a") == 9  # b still needs 50
        await publish_needs(client, etcd_root, "b", {"shared/j": 300})
        assert await guard("shared/j") == 200  # now a is the lowest
    finally:
        await client.close()
