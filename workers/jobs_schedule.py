"""Where the jobs tasks plug into the Celery app (workers.app): their modules, their
queue and their beat entry, in one place so the app gains them by three lines.

Queue `jobs` carries the scheduler's sweep and the run executors; a worker that should
run jobs consumes it (`-Q ...,jobs`).
"""

from __future__ import annotations

from typing import Any

from workers.config import WorkerSettings

JOB_TASK_MODULES = ["workers.jobs", "workers.jobs_run", "workers.jobs_targets",
                    "workers.jobs_roll"]

JOB_ROUTES = {
    "workers.jobs.*": {"queue": "jobs"},
    "workers.jobs_run.*": {"queue": "jobs"},
    "workers.jobs_targets.*": {"queue": "jobs"},
    "workers.jobs_roll.*": {"queue": "jobs"},
}


def job_beat(worker: WorkerSettings) -> dict[str, Any]:
    return {
        "jobs-sweep": {
            "task": "workers.jobs.sweep",
            "schedule": worker.jobs_interval,
            "options": {"queue": "jobs", "expires": worker.jobs_interval},
        },
    }
