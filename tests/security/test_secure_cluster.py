"""Every door of a real `quire up --secure` cluster: one row per door, each refused with a
clear error and nothing changed, and the allowed paths of the cluster's own roles.

One cluster for the module (conftest.py): two coordinators with mTLS and tokens, etcd
over TLS with client certificates and RBAC, Redis with ACL users over TLS only, a worker
that checks signed messages, beat, and the dashboard over HTTPS.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from protocol.auth import Capability, Scope
from tools.services import wait_for

from .conftest import SecureCluster, forged_message

pytestmark = pytest.mark.timeout(600)

KEPT, DOOMED, GONE = "sec/kept", "sec/doomed", "sec/gone"
LINE = b"y" * 1500 + b"\n"


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """`wait_for` at the pace of the cluster's processes (polled twice a second)."""
    return wait_for(predicate, timeout=timeout, what=what, interval=0.5)


# -- the allowed paths ------------------------------------------------------------------------

def test_worker_persists_and_beat_pulses(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    c = secure_cluster
    for name in (KEPT, DOOMED, GONE):
        spec = tmp_path / f"{name.replace('/', '-')}.yaml"
        spec.write_text(f"name: {name}\nreplication: 2\nfragment:\n  length: 1KiB\n"
                        f"  refresh_interval: 1s\n  stores: [{c.info['store']}]\n")
        res = c.cli("journals", "apply", "-f", str(spec))
        assert res.returncode == 0, res.stderr
    for name in (KEPT, DOOMED, GONE):
        until(lambda n=name: c.cli("append", "-j", n, stdin=LINE).returncode == 0, 60,
              f"{name} to accept appends")
        assert c.cli("append", "-j", name, stdin=LINE).returncode == 0  # rolls the first
    for name in (KEPT, DOOMED, GONE):  # the worker fetched over mTLS and wrote the store
        until(lambda n=name: c.persisted(n), 90, f"{name} to be persisted")
    # Beat's pulse sweep (every 2 s here) fans out signed pulse tasks the worker runs
    # (one per primary member, pulse_member; pulse_journal for a journal with none yet).
    until(lambda: re.search(r'quire_worker_tasks_total\{outcome="success",'
                            r'task="workers.pulse.pulse_(member|journal)"\} [1-9]', c.worker_metrics()),
          60, "a pulse task to succeed")
    assert c.cli("read", "-j", KEPT, "--end-offset", str(len(LINE))).stdout == LINE
    assert c.cli("journals", "delete", DOOMED).returncode == 0  # no --purge: objects stay
    assert c.store_files(DOOMED)


# -- etcd ---------------------------------------------------------------------------------

SHARD = "id: sec-shard\nsources: [sec/kept]\nrecovery_log_prefix: sec/recovery\n"


def _shard_apply(c: SecureCluster, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "shard.yaml"
    spec.write_text(SHARD)
    return c.cli("shards", "apply", "-f", str(spec), env={**c.env, **env})


def _no_shard(c: SecureCluster) -> bool:
    listed = c.cli("shards", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    return b"sec-shard" not in listed.stdout


def test_etcd_without_a_client_certificate(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    res = _shard_apply(secure_cluster, tmp_path, QUIRE_ETCD_CERT="", QUIRE_ETCD_KEY="")
    err = res.stderr.decode()
    assert res.returncode in (5, 6), err  # refused (5) or, through the CLI's probe, unreachable (6)
    assert "etcd" in err and "client certificate" in err, err
    assert _no_shard(secure_cluster)


def test_etcd_user_whose_role_lacks_the_prefix(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    from tools.secure_cluster import etcdctl
    from tools.tls_certs import LocalCA, issue_cert

    c = secure_cluster
    tls = c.info["tls"]
    ca = LocalCA(tls["QUIRE_TLS_CA"], tls["QUIRE_TLS_CERT"], tls["QUIRE_TLS_KEY"])
    root = LocalCA(ca.ca, str(c.data / "tls" / "etcd-root.pem"), str(c.data / "tls" / "etcd-root-key.pem"))
    url = c.info["secure"]["QUIRE_ETCD_URL"]
    for step in (("role", "add", "outsider"),
                 ("role", "grant-permission", "outsider", "readwrite", "/other/", "--prefix=true"),
                 ("user", "add", "outsider", "--no-password"),
                 ("user", "grant-role", "outsider", "outsider")):
        res = etcdctl(url, root, *step)
        assert res.returncode == 0 or "already exists" in res.stderr, res.stderr
    outsider = issue_cert(ca, "etcd-outsider", "outsider")
    res = _shard_apply(c, tmp_path, QUIRE_ETCD_CERT=outsider.cert, QUIRE_ETCD_KEY=outsider.key)
    err = res.stderr.decode()
    assert res.returncode in (5, 6), err
    assert "etcd" in err and "permission denied" in err and "role" in err, err
    assert _no_shard(c)


def test_etcd_over_plain_http(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    c = secure_cluster
    url = c.info["secure"]["QUIRE_ETCD_URL"].replace("https://", "http://")
    res = _shard_apply(c, tmp_path, QUIRE_ETCD_URL=url)
    err = res.stderr.decode()
    assert res.returncode in (5, 6), err
    assert "etcd" in err and "TLS" in err, err
    assert _no_shard(c)


# -- Redis --------------------------------------------------------------------------------

def test_redis_without_a_password(secure_cluster: SecureCluster) -> None:
    from protocol.redis_security import describe_redis_error

    c = secure_cluster
    before = c.queue_len("prune")
    url = f"rediss://127.0.0.1:{c.redis_port}/0?ssl_ca_certs={c.info['tls']['QUIRE_TLS_CA']}"
    with pytest.raises(redis.exceptions.AuthenticationError) as exc:
        redis.Redis.from_url(url, socket_timeout=5).lpush("prune", b"forged")
    assert "authentication required" in describe_redis_error(exc.value, url)
    assert c.queue_len("prune") == before


def test_redis_with_the_workers_user_over_plain_tcp(secure_cluster: SecureCluster) -> None:
    c = secure_cluster
    before = c.queue_len("prune")
    password = (c.data / "secure" / "redis-worker.password").read_text().strip()
    url = f"redis://quire-worker:{password}@127.0.0.1:{c.redis_port}/0"
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5).lpush("prune", b"x")
    assert c.queue_len("prune") == before


def test_coordinators_redis_user_cannot_enqueue_deletions(secure_cluster: SecureCluster) -> None:
    c = secure_cluster
    password = (c.data / "secure" / "redis-coordinator.password").read_text().strip()
    url = (f"rediss://quire-coordinator:{password}@127.0.0.1:{c.redis_port}/0"
           f"?ssl_ca_certs={c.info['tls']['QUIRE_TLS_CA']}")
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(url, socket_timeout=5).lpush("prune", b"forged")


# -- Celery messages ----------------------------------------------------------------------

def test_unsigned_purge_pushed_into_redis(secure_cluster: SecureCluster) -> None:
    c = secure_cluster
    files = c.store_files(DOOMED)
    assert files
    task = "workers.prune.purge_journal"
    before = c.refused_count(task, "unsigned")
    c.push_as_worker("prune", forged_message(task, [DOOMED, [c.info["store"]]], {}, "prune"))
    until(lambda: c.refused_count(task, "unsigned") == before + 1, 60, "the refusal counted")
    log = (c.data / "logs" / "worker" / "worker.log").read_text()
    assert "task refused" in log and "is not signed" in log
    assert c.store_files(DOOMED) == files  # refused before its body: counted means done


def test_signed_purge_without_an_apply_token(secure_cluster: SecureCluster) -> None:
    from protocol.task_signing import sign

    c = secure_cluster
    files = c.store_files(DOOMED)
    task = "workers.prune.purge_journal"
    ring = c.keyring()
    before = c.refused_count(task, "no_apply_token")
    args = [DOOMED, [c.info["store"]]]
    # Signed, but a token without APPLY (and then none): both refused before deleting.
    read_only = ring.mint(Capability.READ, Scope.of([DOOMED]), 60, "intruder")
    for kwargs in ({"capability": read_only}, {}):
        msg = json.loads(forged_message(task, args, kwargs, "prune"))
        tid = msg["headers"]["id"]
        msg["headers"]["quire_sig"] = sign(ring.task_keys(), task, tid, args, kwargs)
        c.push_as_worker("prune", json.dumps(msg).encode())
    until(lambda: c.refused_count(task, "no_apply_token") == before + 2, 60, "both refusals counted")
    assert c.store_files(DOOMED) == files
    # A forged signature is refused as such.
    msg = json.loads(forged_message(task, args, {}, "prune"))
    msg["headers"]["quire_sig"] = "0" * 64
    bad = c.refused_count(task, "bad_signature")
    c.push_as_worker("prune", json.dumps(msg).encode())
    until(lambda: c.refused_count(task, "bad_signature") == bad + 1, 60, "the bad signature counted")
    assert c.store_files(DOOMED) == files


def test_operator_purge_is_signed_and_runs(secure_cluster: SecureCluster) -> None:
    c = secure_cluster
    assert c.store_files(GONE)
    res = c.cli("journals", "delete", GONE, "--purge", "--grace", "0")
    assert res.returncode == 0, res.stderr
    until(lambda: not c.store_files(GONE), 60, "the operator's purge to remove the objects")
    assert c.store_files(DOOMED)  # and nothing else


# -- coordinators: a replicate stream cut at its token's expiry ----------------------------

def test_replicate_stream_cut_when_its_token_expires(secure_cluster: SecureCluster) -> None:
    from bench.common import hello
    from protocol import (Fragment, ListBrokersRequest, ListBrokersResponse, ListRequest,
                          ListResponse, ReplicateProposal)
    from protocol.errors import ProtocolError
    from protocol.tls import client_context

    c = secure_cluster
    tls = c.info["tls"]
    ctx = client_context(tls["QUIRE_TLS_CA"], tls["QUIRE_TLS_CERT"], tls["QUIRE_TLS_KEY"])
    ring = c.keyring()
    admin = c.info["auth"]["token"]
    before = c.cli("read", "-j", KEPT).stdout

    async def run() -> float:
        s = await hello(c.info["broker"].split(",")[0], ssl=ctx, token=admin)
        await s.send(ListRequest())
        listing, _ = await s.read_message(ListResponse)
        await s.send(ListBrokersRequest())
        brokers, _ = await s.read_message(ListBrokersResponse)
        await s.close()
        entry = next(e for e in listing.journals if e.spec.name == KEPT)
        replica = next(m for i, m in enumerate(entry.route.members) if i != entry.route.primary)
        endpoint = next(b.endpoint for b in brokers.brokers if b.id == replica)
        token = ring.mint(Capability.REPLICATE, Scope.of([KEPT]), 2, "short-lived-peer")
        stream = await hello(endpoint, ssl=ctx, token=token)
        started = time.monotonic()
        await stream.send(ReplicateProposal(proposal=Fragment(journal=KEPT), header=listing.header.__class__(
            route=entry.route, etcd=listing.header.etcd)))
        with pytest.raises(ProtocolError):  # closed with no answer: cut, not refused
            async with asyncio.timeout(25):
                frame = await stream.read()
                raise AssertionError(f"answered {frame.message!r} instead of being cut")
        await stream.close()
        return time.monotonic() - started

    elapsed = asyncio.run(run())
    assert 1.0 <= elapsed < 25, elapsed
    replica_log = "".join(p.read_text() for p in (c.data / "logs").glob("coordinator-*/*.log"))
    assert "replicate stream cut at token expiry" in replica_log
    assert c.cli("read", "-j", KEPT).stdout == before
    assert c.cli("append", "-j", KEPT, stdin=LINE).returncode == 0  # the real pipeline is fine


# -- the dashboard ------------------------------------------------------------------------

def test_dashboard_over_plain_http(secure_cluster: SecureCluster) -> None:
    c = secure_cluster
    url = c.info["dashboard"]
    assert url.startswith("https://")
    with pytest.raises((OSError, urllib.error.URLError)):  # type: ignore[attr-defined]
        urllib.request.urlopen(url.replace("https://", "http://") + "healthz", timeout=10).read()
    ctx = ssl.create_default_context(cafile=c.info["tls"]["QUIRE_TLS_CA"])
    with urllib.request.urlopen(url + "healthz", timeout=10, context=ctx) as resp:
        assert resp.read() == b"ok\n"
    # /api/state wants a LIST token from each viewer.
    with pytest.raises(urllib.error.HTTPError) as exc:  # type: ignore[attr-defined]
        urllib.request.urlopen(url + "api/state", timeout=10, context=ctx)
    assert exc.value.code == 401


def test_metrics_stay_on_loopback(secure_cluster: SecureCluster) -> None:
    import psutil

    c = secure_cluster
    port = int(c.ports["worker_metrics"])
    bound = [conn.laddr for conn in psutil.net_connections("tcp")
             if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port]
    assert bound and all(a.ip == "127.0.0.1" for a in bound), bound


# -- a consumer commits and Spark reads, through etcd's TLS and RBAC ------------------------

CLICKS, COUNTS, RECOVERY = "sec/clicks", "sec/counts", "sec/recovery/sec-counts"


def _totals(c: SecureCluster) -> dict[str, int]:
    """The last published total per key of the counts app's output journal."""
    out: dict[str, int] = {}
    for line in c.cli("read", "-j", COUNTS).stdout.splitlines():
        row = json.loads(line)
        out[row["key"]] = row["count"]
    return out


def _consumer(c: SecureCluster, tmp_path: Path, suffix: str, token: str):  # noqa: ANN202
    """A consumer member as a deployment runs it: etcd over TLS as the `quire` user (its
    client certificate), coordinators over mTLS with a token of its own — no keys file,
    no operator token, no Redis."""
    from tools.services import Service

    env = {k: v for k, v in c.env.items() if not k.startswith(("QUIRE_AUTH_", "QUIRE_REDIS"))}
    env.update({"QUIRE_TOKEN": token, "QUIRE_DISCOVER": "0"})
    work = tmp_path / f"consumer-{suffix}"
    argv = [sys.executable, "-m", "consumers.main", "run", "consumers.examples.counts:Counts",
            "--zone", "zone-a", "--id", suffix, "--data-dir", str(work / "data"), "--ttl", "5",
            "--snapshot-interval", "2"]
    log = work / f"consumer-{suffix}.log"  # Service's log: `ready <member>` once registered
    return Service(f"consumer-{suffix}", argv, env=env, workdir=work, ready_timeout=60,
                   stop_timeout=60, probe=lambda: "\nready " in log.read_text(errors="replace"))


def test_consumer_commits_through_secure_etcd(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    """A consumer shard reads a journal and commits its offsets through its recovery log;
    a second member, started from nothing, restores that commit (no message counted twice)."""
    c = secure_cluster
    for name in (CLICKS, COUNTS, RECOVERY):
        spec = tmp_path / f"{name.replace('/', '-')}.yaml"
        spec.write_text(f"name: {name}\nreplication: 2\nfragment:\n  length: 1MiB\n"
                        f"  stores: [{c.info['store']}]\n")
        res = c.cli("journals", "apply", "-f", str(spec))
        assert res.returncode == 0, res.stderr
    shard = tmp_path / "counts-shard.yaml"
    shard.write_text("id: sec-counts\nsources: [sec/clicks]\nrecovery_log_prefix: sec/recovery\n"
                     "checkpoint_interval: 1s\nlabels: {output: sec/counts}\n")
    res = c.cli("shards", "apply", "-f", str(shard))
    assert res.returncode == 0, res.stderr
    first = b"".join(json.dumps({"key": f"k{i % 4}"}).encode() + b"\n" for i in range(40))
    until(lambda: c.cli("append", "-j", CLICKS, stdin=first).returncode == 0, 60, "appends to sec/clicks")
    # Its own token: list/read/append on its journals only.
    token = c.keyring().mint(Capability.LIST | Capability.READ | Capability.APPEND,
                            Scope.of([CLICKS, COUNTS, "sec/recovery/"]), 600, "sec-consumer")

    def caught_up(n: int) -> bool:
        row = c.shard_row("sec-counts")
        return bool(row and row["state"] == "PRIMARY" and row["sources"]
                    and row["sources"][0]["offset"] == n and row["transactions"] >= 1)

    member = _consumer(c, tmp_path, "sec-m1", token)
    try:
        member.start()
        until(lambda: caught_up(len(first)), 90, "the shard to read through the journal")
    finally:
        code = member.stop()
    assert code == 0, member.log_tail()  # a clean release: committed, then let go
    assert _totals(c) == {f"k{i}": 10 for i in range(4)}
    assert c.cli("read", "-j", RECOVERY).stdout  # the commit is in the recovery log
    # More input, and a member with an empty data dir: it restores offsets and counts
    # from the recovery log, so only the new lines are counted.
    second = b"".join(json.dumps({"key": f"k{i % 4}"}).encode() + b"\n" for i in range(8))
    assert c.cli("append", "-j", CLICKS, stdin=second).returncode == 0
    member = _consumer(c, tmp_path, "sec-m2", token)
    try:
        member.start()
        until(lambda: caught_up(len(first) + len(second)), 90, "the restored shard to read on")
    finally:
        code = member.stop()
    assert code == 0, member.log_tail()
    assert _totals(c) == {f"k{i}": 12 for i in range(4)}


@pytest.mark.spark
def test_spark_reads_through_secure_etcd(secure_cluster: SecureCluster, spark, monkeypatch) -> None:  # noqa: ANN001
    """The selector is resolved against the specs in etcd, over TLS as the `quire` user."""
    from spark.datasource import register

    c = secure_cluster
    for k, v in c.info["secure"].items():
        monkeypatch.setenv(k, v)
    register(spark)
    df = (spark.read.format("quire").option("store", c.info["store"])
          .option("selector", f"name={KEPT}").option("etcd", c.info["secure"]["QUIRE_ETCD_URL"])
          .option("etcdCa", c.info["secure"]["QUIRE_ETCD_CA"])
          .option("etcdCert", c.info["secure"]["QUIRE_ETCD_CERT"])
          .option("etcdKey", c.info["secure"]["QUIRE_ETCD_KEY"])
          .option("framing", "raw").load())
    values = df.select("value").toArrow().column("value").to_pylist()
    assert sum(len(v) for v in values) >= 2 * len(LINE), values[:1]


# -- persistence you can see (issue 51) ------------------------------------------------------

def test_apply_refuses_a_store_no_worker_accepts(secure_cluster: SecureCluster,
                                                 tmp_path: Path) -> None:
    """Case 2: a spec naming file:///some/dir/ (not the cluster's store) is refused up
    front, naming the store the (auth-on) worker accepts; nothing is applied."""
    c = secure_cluster
    spec = tmp_path / "elsewhere.yaml"
    spec.write_text("name: sec/elsewhere\nreplication: 1\nfragment:\n"
                    "  stores: [file:///some/dir/]\n")
    # --dry-run applies nothing, so polling it is safe while the worker announces itself.
    res = until(lambda: (r := c.cli("journals", "apply", "--dry-run", "-f", str(spec))).returncode
                == 7 and r, 60, "the worker's stores to be announced")
    res = c.cli("journals", "apply", "-f", str(spec))
    said = " ".join(res.stderr.decode().split())
    assert res.returncode == 7, said
    assert "refused: no live worker persists to file:///some/dir/ (journal sec/elsewhere)" in said
    assert f"accept: {c.info['store']}" in said
    listed = c.cli("journals", "list", "-o", "json")
    assert listed.returncode == 0 and b"sec/elsewhere" not in listed.stdout


def test_backlog_reported_through_the_coordinators_redis_user(secure_cluster: SecureCluster,
                                                              tmp_path: Path) -> None:
    """The primary writes its backlog report with the coordinators' ACL user, and
    `journals list --stats` shows it."""
    c = secure_cluster
    name = "sec/backlog"
    spec = tmp_path / "backlog.yaml"
    spec.write_text(f"name: {name}\nreplication: 1\nfragment:\n  length: 1MiB\n"
                    f"  stores: [{c.info['store']}]\n")
    assert c.cli("journals", "apply", "-f", str(spec)).returncode == 0
    until(lambda: c.cli("append", "-j", name, stdin=LINE).returncode == 0, 60,
          f"{name} to accept appends")

    def backlog() -> int:
        out = c.cli("journals", "list", "--stats", "-l", f"name={name}", "-o", "json")
        assert out.returncode == 0, out.stderr
        [row] = [json.loads(ln) for ln in out.stdout.splitlines()]
        return row["backlog_bytes"] or 0
    assert until(backlog, 30, "the backlog report") >= len(LINE)
