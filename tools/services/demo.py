"""`python -m tools.services.demo`: start quire's dependencies, show them,
prove a worker answers, and stop everything.

This is what `make run` does until the coordinator exists; it says so rather
than pretending a broker is running.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack

from celery.exceptions import TimeoutError as CeleryTimeoutError
from rich.console import Console
from rich.table import Table

from tools.services import (
    CeleryWorkerService,
    EtcdService,
    RedisService,
    ServiceError,
    celery_client,
)


def main() -> int:
    console = Console()
    console.print(
        "[bold]quire demo[/]: starting etcd, redis-server and a Celery worker on 127.0.0.1.\n"
        "[yellow]The quire broker itself (coordinators, append/read) is not wired yet;[/] "
        "this only starts and stops its dependencies."
    )
    t0 = time.monotonic()
    try:
        with ExitStack() as stack:
            etcd = stack.enter_context(EtcdService("etcd"))
            redis = stack.enter_context(RedisService("redis"))
            worker = stack.enter_context(
                CeleryWorkerService("worker", redis_url=redis.url, pool="threads", concurrency=1)
            )

            table = Table(title=f"running (ready in {time.monotonic() - t0:.1f}s)")
            for col in ("service", "pid", "address", "log"):
                table.add_column(col)
            for svc in (etcd, redis, worker):
                table.add_row(svc.name, str(svc.pid), svc.describe(), str(svc.log_path))
            console.print(table)

            client = celery_client(redis.url)
            try:
                t1 = time.monotonic()
                reply = client.send_task("workers.health.ping", args=["demo"]).get(timeout=30)
                ms = (time.monotonic() - t1) * 1000
                console.print(f"workers.health.ping answered by {reply['worker']} in {ms:.0f} ms")
            finally:
                client.close()
            console.print("stopping everything")
    except (ServiceError, TimeoutError, CeleryTimeoutError) as exc:
        console.print("[red]demo failed:[/]", end=" ")
        console.print(str(exc), markup=False, highlight=False)
        return 1
    console.print(f"done in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
