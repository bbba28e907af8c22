"""Flower started against the workers app lists the worker and its tasks (HTTP API)."""

from __future__ import annotations

import os
import sys
import uuid

import msgspec
import pytest
import requests

from tools.services import Service, free_port, wait_for

from .fragment_server import FragmentServer, make_fragment
from .workers_support import put_journal


@pytest.fixture
def flower(env):
    port = free_port()
    svc = Service(f"flower-{uuid.uuid4().hex[:6]}", [
        sys.executable, "-m", "celery", "-A", "workers.app", "flower",
        f"--port={port}", "--address=127.0.0.1"],
        env={**env, "FLOWER_UNAUTHENTICATED_API": "true"},
        probe=lambda: requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=1).ok)
    svc.start()
    svc.base = f"http://127.0.0.1:{port}"
    yield svc
    svc.close()


def test_flower_lists_worker_and_persist_index_pulse_tasks(
        flower, start_worker, client, etcd, etcd_root, file_store) -> None:
    worker = start_worker()
    server = FragmentServer().start()
    try:
        data = os.urandom(10_000)
        f = make_fragment("acme/flower", 0, data, codec="gzip")
        server.add(f, data)
        put_journal(etcd, etcd_root, "acme/flower", stores=(file_store,))
        ids = {
            client.send_task("workers.persist.persist_fragment", queue="persist", kwargs={
                "fragment": msgspec.to_builtins(f), "endpoints": [server.endpoint],
                "store": file_store}).id: "workers.persist.persist_fragment",
            client.send_task("workers.index.refresh_journal", args=["acme/flower"],
                             queue="index").id: "workers.index.refresh_journal",
            client.send_task("workers.pulse.pulse_journal", args=["acme/no-such-journal"],
                             queue="pulse").id: "workers.pulse.pulse_journal",
        }

        def workers():
            r = requests.get(f"{flower.base}/api/workers", params={"refresh": "1"}, timeout=10)
            r.raise_for_status()
            return worker.nodename in r.json()

        wait_for(workers, timeout=30, interval=0.5, what="Flower to list the worker")

        def finished():
            r = requests.get(f"{flower.base}/api/tasks", timeout=10)
            r.raise_for_status()
            tasks = r.json()
            return all(tasks.get(i, {}).get("state") == "SUCCESS" for i in ids) and tasks

        tasks = wait_for(finished, timeout=60, interval=0.5, what="Flower to see the tasks finish")
        assert {tasks[i]["name"] for i in ids} == set(ids.values())
        assert all(tasks[i]["worker"] == worker.nodename for i in ids)
    finally:
        server.stop()
