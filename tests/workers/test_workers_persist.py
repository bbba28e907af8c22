"""The persist task in a real worker process, against S3 (moto) and a file store."""

from __future__ import annotations

import hashlib
import os
import time

import msgspec
import pytest

from fragment_store import decompress, fragment_key, open_store
from tools.services import wait_for

from .fragment_server import FragmentServer, make_fragment
from .workers_support import s3_url

TASK = "workers.persist.persist_fragment"


@pytest.fixture
def server():
    s = FragmentServer().start()
    yield s
    s.stop()


def send(client, fragment, endpoints, store):
    return client.send_task(TASK, kwargs={"fragment": msgspec.to_builtins(fragment),
                                          "endpoints": list(endpoints), "store": store},
                            queue="persist")


def test_persist_uploads_compressed_object_under_its_key(start_worker, client, server, s3_bucket) -> None:
    data = os.urandom(200_000) + b"hello\n" * 10_000
    f = make_fragment("acme/orders/part-000", 123, data, codec="gzip")
    server.add(f, data)
    store = s3_url(s3_bucket, "quire/")
    start_worker(queues=("persist", "index"))

    out = send(client, f, ["127.0.0.1:1", server.endpoint], store).get(timeout=60)
    key = fragment_key(f)
    assert key == f"acme/orders/part-000/{f.begin:016x}-{f.end:016x}-{f.sum}.gz"
    assert out["result"] == "uploaded" and out["key"] == key
    stored = s3_bucket.client.get_object(bucket_name=s3_bucket.name, object_name="quire/" + key).read()
    assert len(stored) < len(data)  # compressed with the journal's codec
    raw = decompress(f.codec, stored)
    assert raw == data and hashlib.sha1(raw).hexdigest() == f.sum

    # Idempotent: the object exists, so nothing is fetched or uploaded again.
    served = server.requests
    again = send(client, f, [server.endpoint], store).get(timeout=60)
    assert again["result"] == "exists"
    assert server.requests == served


def test_persist_to_file_store(start_worker, client, server, file_store) -> None:
    data = b"line of text\n" * 50_000
    f = make_fragment("acme/logs", 0, data, codec="zstd")
    server.add(f, data)
    start_worker(queues=("persist",))
    out = send(client, f, [server.endpoint], file_store).get(timeout=60)
    assert out["result"] == "uploaded"
    assert b"".join(open_store(file_store).get(out["key"])) != data  # stored compressed
    from fragment_store import read_fragment
    assert b"".join(read_fragment(open_store(file_store), f)) == data


def test_persist_rejects_content_that_does_not_match_the_sum(start_worker, client, server, file_store) -> None:
    data = b"a" * 10_000
    f = make_fragment("acme/bad", 0, data, codec="none")
    server.add(f, b"b" * 10_000)  # a replica serving the wrong bytes
    start_worker(queues=("persist",))
    res = send(client, f, [server.endpoint], file_store)
    # Retried with backoff, never written.
    wait_for(lambda: server.requests >= 2, timeout=30, what="a retry of the bad fetch")
    assert not open_store(file_store).exists(fragment_key(f))
    res.revoke()


def test_worker_killed_mid_upload_redelivers_and_writes_once(start_worker, client, s3_bucket) -> None:
    # 24 MiB, uncompressed: more than one 16 MiB multipart part, read at 8 MiB/s from
    # the replica, so the first part is uploaded when the worker is killed.
    data = os.urandom(24 << 20)
    f = make_fragment("acme/big", 1 << 20, data, codec="none")
    slow = FragmentServer(rate=8 << 20).start()
    try:
        slow.add(f, data)
        store = s3_url(s3_bucket)
        # 60 s: w1 never restores (and redelivers to itself) its own in-flight task
        # before the kill, however slow a loaded machine makes the upload.
        w1 = start_worker(queues=("persist",), QUIRE_WORKER_VISIBILITY_TIMEOUT="60")
        send(client, f, [slow.endpoint], store)
        wait_for(lambda: slow.bytes_served >= 18 << 20, timeout=30, what="the upload to be underway")
        w1.kill()  # SIGKILL of the whole worker: no ack, no reject, no cleanup
        key = fragment_key(f)
        assert [o.object_name for o in s3_bucket.client.list_objects(s3_bucket.name, recursive=True)] == []

        slow.rate = 0
        # This worker restores the abandoned message once it is 15 s old; 15 s also
        # bounds its own upload, so its task is not redelivered while it runs.
        w2 = start_worker(queues=("persist",), QUIRE_WORKER_VISIBILITY_TIMEOUT="15")
        wait_for(lambda: [o.object_name for o in s3_bucket.client.list_objects(
            s3_bucket.name, prefix="acme/", recursive=True)] == [key],
            timeout=90, interval=0.25, what="the redelivered task to write the object")
        assert slow.requests == 2, w1.log_tail(30) + w2.log_tail(30)
        stored = s3_bucket.client.get_object(bucket_name=s3_bucket.name, object_name=key).read()
        assert hashlib.sha1(stored).hexdigest() == f.sum and stored == data
        time.sleep(2)  # nothing else arrives (no third delivery)
        assert slow.requests == 2
        assert w2.log_text().count('"fragment persisted"') == 1
    finally:
        slow.stop()


def test_worker_metrics_count_task_failures_and_persisted_bytes(start_worker, client, server, file_store) -> None:
    from tools.services import free_port
    from .workers_support import scrape

    port = free_port()
    data = b"m" * 5000
    f = make_fragment("acme/metrics", 0, data, codec="none")
    server.add(f, data)
    start_worker(queues=("persist",), QUIRE_WORKER_METRICS_PORT=str(port))
    send(client, f, [server.endpoint], file_store).get(timeout=60)
    bad = msgspec.to_builtins(f) | {"sum": "not-a-sum"}  # a ValidationError: fails for good
    res = client.send_task(TASK, kwargs={"fragment": bad, "endpoints": [], "store": file_store},
                           queue="persist")
    with pytest.raises(Exception, match="sum"):
        res.get(timeout=60)
    task = '{task="workers.persist.persist_fragment"}'
    # The failure signal fires just after the result is stored: poll briefly.
    wait_for(lambda: scrape(port, "quire_worker_task_failures_total") == {task: 1.0},
             timeout=10, what="the failure to be counted")
    assert scrape(port, "quire_persist_bytes_total") == {"": 5000.0}
    assert scrape(port, "quire_persist_fragments_total") == {'{result="uploaded"}': 1.0}
