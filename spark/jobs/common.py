"""What every job shares: its parameters, the SparkSession it runs on, and argv parsing
for spark-submit."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobParams:
    store: str
    out: str
    selector: str = ""
    journal: str = ""
    begin: int = 0
    end: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    """Extra data source options (s3.endpoint, maxSpanBytes, ...)."""

    def source_options(self) -> dict[str, str]:
        opts = {"store": self.store, **self.options}
        if self.selector:
            opts["selector"] = self.selector
        if self.journal:
            opts["journal"] = self.journal
        if self.begin:
            opts["begin"] = str(self.begin)
        if self.end is not None:
            opts["end"] = str(self.end)
        return opts


def session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None) -> Any:
    """A SparkSession with the `quire` format registered. `master` None keeps what
    spark-submit configured (or local[*] when run directly)."""
    from pyspark.sql import SparkSession

    from spark.datasource import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        # Not launched by spark-submit (which starts the JVM first and names the master).
        builder = builder.master("local[*]")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def parse_argv(argv: Sequence[str] | None, description: str) -> tuple[JobParams, str | None]:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--store", required=True, help="store URL: file:///dir/ or s3://bucket/prefix/")
    p.add_argument("--out", required=True, help="output directory (Parquet)")
    p.add_argument("--selector", default="", help="label selector over journals")
    p.add_argument("--journal", default="", help="journal name(s), comma-separated")
    p.add_argument("--begin", type=int, default=0)
    p.add_argument("--end", type=int, default=None)
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, or local[*])")
    p.add_argument("--option", "-O", action="append", default=[], metavar="KEY=VALUE",
                   help="extra data source option (repeatable)")
    ns = p.parse_args(argv)
    options = {}
    for item in ns.option:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--option {item!r}: expected KEY=VALUE")
        options[key] = value
    return (JobParams(store=ns.store, out=ns.out, selector=ns.selector, journal=ns.journal,
                      begin=ns.begin, end=ns.end, options=options), ns.master)
