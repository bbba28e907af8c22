"""`quire spark …`: batch jobs over journals in the store.

    quire spark run hourly-counts --store file:///data/ --selector prefix=topics/clicks/ --out /tmp/r
    quire spark run hourly-counts --master spark://host:7077 --conf spark.driver.host=HOST-ADDRESS ...
    quire spark jobs
    quire spark index --store file:///data/ --selector prefix=topics/   (no JVM)
    quire spark package --out build/quire-batch.zip                     (for spark-submit --py-files)

`command` is a Typer app, mounted by the `quire` CLI through the `quire.commands` entry
point group (`spark = "spark.main:command"`).
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Optional

import typer

command = typer.Typer(name="spark", help="Batch jobs (Spark, Dask) over journals in the store.",
                      no_args_is_help=True, add_completion=False)

PACKAGES = ("spark", "fragment_store", "protocol", "quire")
"""What executors import: the layers a job needs (the client for stream tails and the sink)."""


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _options(items: list[str], flag: str = "--option") -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _default_store() -> str:
    from protocol.discovery import effective_env

    store = effective_env().get("QUIRE_STORE_URL", "")
    if not store:
        _fail("--store: required (or $QUIRE_STORE_URL, or a running `quire up` to find)")
    return store


@command.command("run")
def run(
    job: str = typer.Argument(..., help="job name (see `quire spark jobs`)"),
    store: str = typer.Option("", "--store", help="store URL: file:///dir/ or s3://bucket/prefix/ "
                              "(default $QUIRE_STORE_URL, else a running `quire up`'s)"),
    out: str = typer.Option("quire-out", "--out", help="output directory"),
    selector: str = typer.Option("", "--selector", "-l", help="label selector over journals"),
    journal: str = typer.Option("", "--journal", help="journal name(s), comma-separated"),
    master: Optional[str] = typer.Option(None, "--master", help="Spark master URL (default local[*])"),
    begin: int = typer.Option(0, "--begin", help="first journal offset to read"),
    end: Optional[int] = typer.Option(None, "--end", help="journal offset to stop before"),
    option: list[str] = typer.Option([], "--option", "-O", help="data source option KEY=VALUE"),
    conf: list[str] = typer.Option([], "--conf", "-c",
                                   help="Spark configuration KEY=VALUE, as spark-submit's "
                                        "(e.g. spark.driver.host=HOST-ADDRESS for a driver that "
                                        "executors on other hosts must reach)"),
) -> None:
    """Run a batch job on local[*] (or --master) and write its output."""
    from protocol import QuireError

    from .jobs import get_job
    from .jobs.common import JobParams, session

    try:
        module = get_job(job)
        from .options import parse_options

        params = JobParams(store=store or _default_store(), out=out, selector=selector, journal=journal,
                           begin=begin, end=end, options=_options(option, "--option"))
        spark_conf = _options(conf, "--conf")
        parse_options(params.source_options())  # fail before starting a JVM
    except QuireError as exc:
        _fail(str(exc))
    spark = session(f"quire-{job}", master, spark_conf)
    try:
        written = module.run(spark, params)
        typer.echo(f"{job}: wrote {written.count()} rows to {out}")
    finally:
        spark.stop()


@command.command("jobs")
def jobs() -> None:
    """List the batch jobs."""
    from .jobs import JOBS

    for name, module in sorted(JOBS.items()):
        typer.echo(f"{name}\t{module.DESCRIPTION}")


@command.command("index")
def index(
    store: str = typer.Option("", "--store", help="default $QUIRE_STORE_URL, else a running "
                              "`quire up`'s"),
    selector: str = typer.Option("", "--selector", "-l"),
    journal: str = typer.Option("", "--journal"),
    output: str = typer.Option("table", "--format", "-o", help="table or json (JSON Lines)"),
) -> None:
    """Print the covering sets (fragment index) of the selected journals; no JVM."""
    from protocol import QuireError

    from .dask_reader import fragment_index

    from fragment_store.errors import StoreUnavailable
    from protocol.errors import connection_reason

    url = store or _default_store()
    try:
        df = fragment_index(url, selector=selector or None, journal=journal or None)
    except StoreUnavailable as exc:
        from fragment_store import open_store

        endpoint = getattr(open_store(url), "endpoint", None)
        where = f"{url} (S3 endpoint {endpoint})" if endpoint else url
        _fail(f"store unreachable at {where}: {connection_reason(exc)} (set QUIRE_STORE_URL or "
              f"--store; QUIRE_S3_ENDPOINT for an s3:// store's endpoint)")
    except QuireError as exc:
        _fail(str(exc))
    if output == "json":
        for row in df.to_dict(orient="records"):
            typer.echo(json.dumps(row))
    else:
        typer.echo(df[["journal", "begin", "end", "codec", "key"]].to_string(index=False))


@command.command("package")
def package(out: Path = typer.Option(Path("build/quire-batch.zip"), "--out")) -> None:
    """Zip the packages executors import, for `spark-submit --py-files`."""
    root = Path(__file__).resolve().parents[1]
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in PACKAGES:
            for path in sorted((root / pkg).rglob("*.py")):
                zf.write(path, str(path.relative_to(root)))
    typer.echo(str(out))


def main() -> None:  # pragma: no cover - `python -m spark.main`
    command(prog_name="quire spark")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
