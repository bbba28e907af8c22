"""`quire spark …` commands that need no JVM (the Typer app behind the entry point)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from typer.testing import CliRunner

from spark.main import command
from tests.spark.batch_corpus import StoreUnderTest, build_corpus

runner = CliRunner()


def test_jobs_lists_hourly_counts() -> None:
    result = runner.invoke(command, ["jobs"])
    assert result.exit_code == 0 and "hourly-counts" in result.output


def test_index_prints_the_covering_set(file_store: StoreUnderTest) -> None:
    corpus = build_corpus(file_store, sizes={"topics/views/part-000": 80})
    result = runner.invoke(command, ["index", "--store", file_store.url,
                                     "--selector", "prefix=topics/", "-o", "json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["begin"], r["end"]) for r in rows] == [
        (f.begin, f.end) for f in corpus.fragments["topics/views/part-000"]]


def test_run_rejects_bad_options_before_starting_spark(file_store: StoreUnderTest) -> None:
    result = runner.invoke(command, ["run", "hourly-counts", "--store", file_store.url])
    assert result.exit_code == 2 and "option 'journal'" in result.output
    result = runner.invoke(command, ["run", "no-such-job", "--store", file_store.url,
                                     "--selector", "prefix=a/"])
    assert result.exit_code == 2 and "unknown job" in result.output


def test_package_zips_what_executors_import(tmp_path: Path) -> None:
    out = tmp_path / "q.zip"
    result = runner.invoke(command, ["package", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = zipfile.ZipFile(out).namelist()
    assert "spark/datasource.py" in names and "fragment_store/persist.py" in names
    assert "protocol/fragment.py" in names
    # The client rides along: stream tails and the sink use it on executors.
    assert "quire/client/sync.py" in names
    assert not any(n.startswith(("coordinator/", "workers/", "tools/")) for n in names)
