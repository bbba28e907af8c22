"""A `store` fixture parametrized over both backends: a temp directory and a bucket on the
session's real S3 server (moto_server on loopback, via tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fragment_store import FileStore, FragmentStore, S3Store


def make_s3_store(s3, bucket, prefix: str = "pre/fix/") -> S3Store:  # type: ignore[no-untyped-def]
    return S3Store(f"s3://{bucket.name}/{prefix}", endpoint=bucket.url, access_key=s3.access_key,
                   secret_key=s3.secret_key, region=s3.region, read_timeout=10.0,
                   part_size=5 << 20)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FragmentStore]:
    if request.param == "file":
        yield FileStore((tmp_path / "store").as_uri() + "/")
    else:
        s3 = request.getfixturevalue("s3")
        bucket = request.getfixturevalue("s3_bucket")
        st = make_s3_store(s3, bucket)
        try:
            yield st
        finally:
            st.close()


@pytest.fixture
def s3_store_factory(s3, s3_bucket):  # type: ignore[no-untyped-def]
    """make(prefix="pre/fix/", bucket_name=None) -> an S3Store on the test's bucket."""
    made: list[S3Store] = []

    def make(prefix: str = "pre/fix/", bucket_name: str | None = None) -> S3Store:
        class _B:
            name = bucket_name or s3_bucket.name
            url = s3_bucket.url

        made.append(make_s3_store(s3, _B, prefix))
        return made[-1]

    yield make
    for st in made:
        st.close()
