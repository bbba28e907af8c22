"""The minio client against the S3 server on loopback."""

from __future__ import annotations

import io

from tools.services import Bucket


def put(bucket: Bucket, key: str, data: bytes) -> None:
    bucket.client.put_object(bucket.name, key, io.BytesIO(data), len(data))


def test_put_get_range_and_list(s3_bucket: Bucket) -> None:
    content = bytes(range(256)) * 40
    put(s3_bucket, "journal/a/0000-2800-sha.raw", content)
    put(s3_bucket, "journal/a/2800-2900-sha.raw", b"x" * 256)
    put(s3_bucket, "journal/b/0000-0010-sha.raw", b"y" * 16)

    resp = s3_bucket.client.get_object(s3_bucket.name, "journal/a/0000-2800-sha.raw")
    try:
        assert resp.read() == content
    finally:
        resp.close()
        resp.release_conn()

    resp = s3_bucket.client.get_object(
        s3_bucket.name, "journal/a/0000-2800-sha.raw", offset=1000, length=300
    )
    try:
        assert resp.read() == content[1000:1300]
    finally:
        resp.close()
        resp.release_conn()

    listed = [
        o.object_name
        for o in s3_bucket.client.list_objects(s3_bucket.name, prefix="journal/a/", recursive=True)
    ]
    # Listing order is key order, which the fragment key scheme makes offset order.
    assert listed == ["journal/a/0000-2800-sha.raw", "journal/a/2800-2900-sha.raw"]


def test_each_test_gets_an_empty_bucket(s3_bucket: Bucket) -> None:
    assert list(s3_bucket.client.list_objects(s3_bucket.name, recursive=True)) == []
