"""The runner of `kind: dask` job targets (docs/jobs.md, "Targets").

    python -m spark.jobs.dask_run --target package.module:function --run '<run context JSON>'

The workers' run executor starts it as a process (killed past the job's timeout), as it
starts Spark targets, so no worker imports spark or dask. It imports the function named
`package.module:function`, calls it with the run context as keyword arguments and prints
what it returns as one JSON line, the run's result. A target that cannot be imported, or
that raises, exits non-zero: the attempt fails (and is retried) with the message it
printed last. The function reads through the Dask reader (spark.dask_reader) and writes
through the Dask writer (spark.dask_writer) with the context's `idempotency_key`;
spark/jobs/dask_targets.py has the built-in one, `window_counts`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["TargetError", "load", "main"]


class TargetError(RuntimeError):
    """The target names no function this process can import (the message says why)."""


def load(name: str) -> Callable[..., Any]:
    """The function `package.module:function` names."""
    from protocol.errors import ValidationError
    from protocol.job import validate_function_name

    try:
        validate_function_name(name, "target.name")
    except ValidationError as exc:
        raise TargetError(str(exc)) from None
    module_name, _, function = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"target {name!r}: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, function, None)
    if fn is None:
        raise TargetError(f"target {name!r}: module {module_name!r} has no {function!r}")
    if not callable(fn):
        raise TargetError(f"target {name!r}: {function!r} is a {type(fn).__name__}, "
                          "not a function")
    return fn  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run a Dask function as a job's target")
    p.add_argument("--target", required=True, help="package.module:function")
    p.add_argument("--run", required=True, help="the run context (JSON)")
    ns = p.parse_args(argv)
    try:
        fn = load(ns.target)
        ctx = json.loads(ns.run)
    except (TargetError, ValueError) as exc:
        print(f"dask_run: {exc}", file=sys.stderr)
        return 2
    result = fn(**ctx)
    print(json.dumps({} if result is None else result, default=str, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
