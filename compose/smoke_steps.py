"""The client half of compose/smoke.py, run inside the compose network (service `smoke`
of compose/ci.yml, the quire image) since the coordinators are reachable only there:

    python /opt/smoke/steps.py journals | append N | read N | persisted | consumer N
                               | route JOURNAL | failover JOURNAL | brokers | refusals

Each step prints what it did and, last, one line `RESULT {json}` for the host side. The
steps are the demo's (tools/demo.py, tools/demo_consumer.py) through the deployment:
quire's own client against the coordinators, etcd for the shard spec, the store read
with the minio client the workers use. A step that does not see what it should exits 1.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
import time

from minio import Minio

from protocol import Codec, FragmentSpec, JournalSpec, LabelSet
from protocol.shard import ShardSource, ShardSpec
from quire.client import AppendService, Client, Mapper, encode, read_messages
from topology.etcd import connect
from topology.shards import ShardChange, apply_shards, list_statuses

BROKERS = os.environ["QUIRE_BROKER"].split(",")
ETCD, ROOT = os.environ["QUIRE_ETCD_URL"], os.environ.get("QUIRE_ETCD_ROOT", "/quire")
STORE = "s3://quire/fragments/"
TOPIC, PARTITIONS = "smoke-events", 4
TOTALS, RECOVERY, SHARD = "smoke/counts/totals", "smoke/recovery", "smoke-counts"


def say(msg: str) -> None:
    print(msg, flush=True)


def result(**fields) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", flush=True)
    raise SystemExit(1)


def fragment(length: int = 8 << 10) -> FragmentSpec:
    """8 KiB: the ~30 KB each partition gets rolls into fragments the workers persist."""
    return FragmentSpec(length=length, compression_codec=Codec.GZIP, stores=(STORE,),
                        refresh_interval=1.0)


def topic_specs() -> list[JournalSpec]:
    labels = LabelSet.of({"topic": TOPIC, "content-type": "application/x-ndjson"})
    return [JournalSpec(name=f"smoke/events/part-{i:03d}", replication=2, labels=labels,
                        fragment=fragment()) for i in range(PARTITIONS)]


async def step_journals(client: Client) -> None:
    specs = topic_specs() + [
        JournalSpec(name=n, replication=2, fragment=fragment(1 << 20))
        for n in (TOTALS, f"{RECOVERY}/{SHARD}", "smoke/failover")]
    revision = await client.apply(specs)
    listed = [e.spec.name for e in await client.list_journals("prefix=smoke/")]
    say(f"applied {len(specs)} journals at etcd revision {revision}: {', '.join(listed)}")
    if len(listed) != len(specs):
        fail(f"listed {len(listed)} journals, applied {len(specs)}")
    result(revision=revision, journals=listed)


async def step_append(client: Client, n: int) -> None:
    mapper = Mapper(f"topic={TOPIC}", client)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    started = time.monotonic()
    async with AppendService(client) as svc:
        futures = []
        for i in range(n):
            user = f"user-{i % 37:02d}"
            ts = (base + dt.timedelta(minutes=i)).isoformat()
            futures.append(await svc.append(await mapper.map(user), encode({"key": user, "ts": ts, "n": i})))
        await svc.flush(timeout=120)
    spans = [f.result() for f in futures]
    size = sum(s.size for s in spans)
    took = time.monotonic() - started
    say(f"appended {n} messages ({size} bytes) in {took:.2f}s through AppendService "
        f"to {len(mapper.journals)} journals")
    result(messages=n, bytes=size, seconds=round(took, 2))


async def step_read(client: Client, n: int) -> None:
    seen, first = 0, []
    for spec in topic_specs():
        async for offset, message in read_messages(client.read(spec.name, 0, end_offset=await client.write_head(spec.name))):
            seen += 1
            if len(first) < 3:
                first.append((spec.name, offset, message))
    for name, offset, message in first:
        say(f"  {name} offset {offset:>6}  {message}")
    say(f"read {seen} messages back from {PARTITIONS} journals")
    if seen != n:
        fail(f"read {seen} messages, appended {n}")
    result(messages=seen)


async def step_persisted(client: Client) -> None:
    deadline = time.monotonic() + 180
    while True:
        fragments = {s.name: await client.list_fragments(s.name) for s in topic_specs()}
        persisted = {j: [f.spec for f in fs if f.spec.is_persisted] for j, fs in fragments.items()}
        if all(persisted.values()):
            break
        if time.monotonic() > deadline:
            fail("no persisted fragment within 180s of: "
                 + ", ".join(j for j, fs in persisted.items() if not fs))
        await asyncio.sleep(1.0)
    s3 = Minio(os.environ["QUIRE_S3_ENDPOINT"].removeprefix("http://"),
               access_key=os.environ["QUIRE_S3_ACCESS_KEY"], secret_key=os.environ["QUIRE_S3_SECRET_KEY"],
               secure=False, region=os.environ.get("QUIRE_S3_REGION", "us-east-1"))
    objects = [o for o in s3.list_objects("quire", prefix="fragments/", recursive=True)
               if "smoke/events/" in o.object_name]
    for journal, specs in persisted.items():
        covered = sum(f.end - f.begin for f in specs)
        say(f"  {journal}: {len(specs)} fragment(s) in the store, offsets covered {covered}, "
            f"e.g. {specs[0].backing_store}…")
    say(f"{len(objects)} fragment objects under s3://quire/fragments/ for smoke/events/ "
        f"({sum(o.size for o in objects)} bytes)")
    if not objects:
        fail("the coordinators list persisted fragments but the bucket holds none")
    result(fragments=sum(len(v) for v in persisted.values()), objects=len(objects))


async def step_consumer(client: Client, n: int) -> None:
    etcd = await connect(ETCD)
    try:
        spec = ShardSpec(id=SHARD, sources=(ShardSource(selector=f"topic={TOPIC}"),),
                         recovery_log_prefix=RECOVERY, checkpoint_interval=0.5,
                         labels=LabelSet.of(output=TOTALS))
        await apply_shards(etcd, ROOT, [ShardChange(spec=spec)])
        say(f"applied shard {SHARD} (sources topic={TOPIC}, output {TOTALS}); "
            f"member consumer-a1 runs consumers.examples.counts:Counts")
        deadline = time.monotonic() + 180
        totals: dict[str, int] = {}
        while sum(totals.values()) < n:
            if time.monotonic() > deadline:
                fail(f"the consumer counted {sum(totals.values())} of {n} messages in 180s")
            await asyncio.sleep(1.0)
            head = await client.write_head(TOTALS)
            if head:
                async for _, data in client.read(TOTALS, 0, end_offset=head):
                    for line in data.splitlines():
                        row = json.loads(line)
                        totals[row["key"]] = row["count"]
        statuses = (await list_statuses(etcd, ROOT)).get(SHARD, [])
        for s in statuses:
            say(f"  shard {SHARD}: {s.state.value} on {s.member}")
        top = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        say(f"the consumer counted {sum(totals.values())} messages over {len(totals)} keys "
            f"(top: {', '.join(f'{k}={v}' for k, v in top)})")
        if sum(totals.values()) != n:
            fail(f"counted {sum(totals.values())}, appended {n}")
        result(counted=sum(totals.values()), keys=len(totals))
    finally:
        await etcd.close()


async def step_route(client: Client, journal: str) -> None:
    """The journal's primary and the endpoint it advertises (from the broker list: a
    listed route may leave endpoints out)."""
    route = (await client.get_journal(journal)).route
    if route.primary < 0:
        fail(f"{journal} has no primary: {route}")
    primary = route.primary_id
    endpoints = {(b.id.zone, b.id.suffix): b.endpoint for b in await client.list_brokers()}
    endpoint = endpoints.get((primary.zone, primary.suffix), "")
    if not endpoint:
        fail(f"primary {primary} of {journal} is not among the brokers {sorted(endpoints)}")
    members = [f"{m.zone}/{m.suffix}" for m in route.members]
    say(f"{journal}: primary {primary.zone}/{primary.suffix} at {endpoint}, members {members}")
    result(primary=f"{primary.zone}/{primary.suffix}", endpoint=endpoint, members=members)


async def step_brokers(client: Client) -> None:
    brokers = await client.list_brokers()
    for b in brokers:
        say(f"  {b.id.zone}/{b.id.suffix} at {b.endpoint}: {b.assigned} assigned, "
            f"{b.primaries} primaries{' (exiting)' if b.exiting else ''}")
    result(brokers=[{"id": f"{b.id.zone}/{b.id.suffix}", "endpoint": b.endpoint,
                     "assigned": b.assigned, "exiting": b.exiting} for b in brokers])


async def step_failover(client: Client, journal: str) -> None:
    """Append one message at a time to `journal` until appends have stopped for a while
    (the host kills the primary's container after `READY`) and then resumed for 40 more;
    then read the journal back: every acknowledged message must be there."""
    acked: list[tuple[int, float]] = []
    gap = None
    seq = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        seq += 1
        try:
            await client.append(journal, encode({"seq": seq}), retry_timeout=120)
        except Exception as exc:  # noqa: BLE001 - an append that failed for good is not acked
            say(f"append {seq} failed: {type(exc).__name__}: {exc}")
            continue
        now = time.time()
        if acked and gap is None and now - acked[-1][1] > 2.0:
            gap = (acked[-1][1], now)
            say(f"GAP {gap[0]:.3f} {gap[1]:.3f} appends resumed after {now - acked[-1][1]:.1f}s")
        acked.append((seq, now))
        if len(acked) == 20:
            say("READY")
        if gap is not None and acked[-1][0] - 40 >= next(s for s, t in acked if t >= gap[1]):
            break
        await asyncio.sleep(0.05)
    if gap is None:
        fail(f"appends never stopped for more than 2s ({len(acked)} acked): was the primary killed?")
    found = set()
    async for _, message in read_messages(client.read(journal, 0, end_offset=await client.write_head(journal))):
        found.add(message["seq"])
    lost = [s for s, _ in acked if s not in found]
    say(f"{len(acked)} appends acknowledged, {len(found)} distinct messages read back, "
        f"{len(lost)} acknowledged ones missing")
    if lost:
        fail(f"acknowledged appends lost: {lost[:20]}")
    result(acked=len(acked), gap_start=gap[0], gap_end=gap[1], lost=0)


async def step_refusals() -> None:
    """The secure deployment's doors, each refused with a clear error: etcd over plain
    HTTP, etcd over TLS without a client certificate, Redis without a password, Redis
    over plain TCP; then a hand-made unsigned persist task pushed into Redis with the
    coordinators' own ACL user (the host checks worker-persist refused and counted it)."""
    import base64
    import uuid

    import redis

    from topology.etcd import connect as etcd_connect
    from topology.etcd_client import EtcdTLS

    refused: dict[str, str] = {}

    async def etcd_refuses(what: str, url: str, tls: EtcdTLS | None) -> None:
        try:
            client = await etcd_connect(url, tls=tls, probe=5.0, root=ROOT)
        except Exception as exc:  # noqa: BLE001 - any refusal will do; its text is shown
            refused[what] = " ".join(str(exc).split())[:300]
            return
        await client.close()
        fail(f"{what}: etcd answered")

    plain = ",".join(u.replace("https://", "http://") for u in ETCD.split(","))
    await etcd_refuses("etcd over plain HTTP", plain, None)
    await etcd_refuses("etcd without a client certificate", ETCD, EtcdTLS(os.environ["QUIRE_ETCD_CA"]))
    ca = os.environ["QUIRE_TLS_CA"]
    for what, url in (("Redis without a password", f"rediss://redis:6379/0?ssl_ca_certs={ca}"),
                      ("Redis over plain TCP", "redis://redis:6379/0")):
        try:
            redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5).lpush("persist", b"x")
        except redis.exceptions.RedisError as exc:
            refused[what] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            fail(f"{what}: Redis took the message")
    for what, why in refused.items():
        say(f"  refused: {what}: {why}")
    # What anyone holding a Redis password could push: a persist task, unsigned.
    tid = str(uuid.uuid4())
    args = [{"journal": "smoke/forged", "begin": 0, "end": 4096}, ["evil.invalid:8080"],
            "s3://quire/forged/"]
    body = base64.b64encode(json.dumps([args, {}, {"callbacks": None, "errbacks": None,
                                                   "chain": None, "chord": None}]).encode())
    message = json.dumps({
        "body": body.decode(), "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"lang": "py", "task": "workers.persist.persist_fragment", "id": tid,
                    "root_id": tid, "parent_id": None, "group": None, "retries": 0, "eta": None,
                    "expires": None, "timelimit": [None, None], "argsrepr": repr(args),
                    "kwargsrepr": "{}", "origin": "forger", "ignore_result": True},
        "properties": {"correlation_id": tid, "reply_to": "", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": "persist"}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())}})
    redis.Redis.from_url(os.environ["QUIRE_REDIS_URL"], socket_timeout=5).lpush("persist", message)
    say(f"pushed an unsigned persist_fragment task {tid} into Redis as quire-coordinator")
    result(refused=sorted(refused), forged=tid)


async def main(argv: list[str]) -> None:
    step, args = argv[0], argv[1:]
    if step == "refusals":  # no coordinator involved
        await step_refusals()
        return
    async with Client(BROKERS, retry_timeout=60) as client:
        if step == "journals":
            await step_journals(client)
        elif step == "append":
            await step_append(client, int(args[0]))
        elif step == "read":
            await step_read(client, int(args[0]))
        elif step == "persisted":
            await step_persisted(client)
        elif step == "consumer":
            await step_consumer(client, int(args[0]))
        elif step == "route":
            await step_route(client, args[0])
        elif step == "brokers":
            await step_brokers(client)
        elif step == "failover":
            await step_failover(client, args[0])
        else:
            fail(f"unknown step {step!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
