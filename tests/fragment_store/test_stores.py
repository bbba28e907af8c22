"""One conformance suite, run against the file store and the real S3 server."""

from __future__ import annotations

import os
import pickle
import urllib.request
from pathlib import Path

import pytest

from fragment_store import (
    FileStore,
    FragmentNotFound,
    FragmentStore,
    InvalidStoreKey,
    S3Store,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
    clear_store_cache,
    open_store,
)
from fragment_store.stores.base import HEALTH_KEY
from protocol import ValidationError


def test_put_get_stat(store: FragmentStore) -> None:
    info = store.put("j/one/a.raw", b"hello world", 11)
    assert info.key == "j/one/a.raw" and info.size == 11 and info.mod_time > 0
    assert store.stat("j/one/a.raw").size == 11
    assert store.exists("j/one/a.raw") and not store.exists("j/one/b.raw")
    assert b"".join(store.get("j/one/a.raw")) == b"hello world"
    assert b"".join(store.get("j/one/a.raw", offset=6)) == b"world"
    assert b"".join(store.get("j/one/a.raw", offset=2, length=3)) == b"llo"
    assert b"".join(store.get("j/one/a.raw", offset=11)) == b""
    assert b"".join(store.get("j/one/a.raw", length=0)) == b""
    store.put("j/one/a.raw", b"replaced")  # overwrite is atomic too
    assert store.read_all("j/one/a.raw") == b"replaced"


def test_put_streams_and_files(store: FragmentStore, tmp_path: Path) -> None:
    big = os.urandom((11 << 20) + 12345)  # > part_size: multipart on S3
    chunks = (big[i:i + 777_777] for i in range(0, len(big), 777_777))
    assert store.put("j/big", chunks).size == len(big)
    assert store.read_all("j/big") == big
    src = tmp_path / "src.bin"
    src.write_bytes(big[:100_000])
    with open(src, "rb") as fh:
        store.put("j/from-file", fh, 100_000)
    assert store.read_all("j/from-file") == big[:100_000]


def test_missing_objects(store: FragmentStore) -> None:
    with pytest.raises(FragmentNotFound):
        store.stat("nope/x")
    with pytest.raises(FragmentNotFound):  # raised at call time, not first iteration
        store.get("nope/x")
    store.delete("nope/x")  # deleting an absent object is fine


def test_list_is_recursive_ordered_and_prefix_exact(store: FragmentStore) -> None:
    keys = ["j/b/2", "j/a", "j/b/1", "j-other/x", "jj/y", "k/z", "j/c/d/e"]
    for k in keys:
        store.put(k, k.encode())
    assert [i.key for i in store.list("j/")] == ["j/a", "j/b/1", "j/b/2", "j/c/d/e"]
    assert [i.key for i in store.list("j/b")] == ["j/b/1", "j/b/2"]
    assert [i.key for i in store.list("j")] == sorted(k for k in keys if k.startswith("j"))
    assert [i.key for i in store.list()] == sorted(keys)
    assert [i.size for i in store.list("k/")] == [3]
    assert list(store.list("absent/")) == []


def test_delete(store: FragmentStore) -> None:
    store.put("j/x", b"1")
    store.delete("j/x")
    assert not store.exists("j/x")
    assert list(store.list("j/")) == []


def test_failing_source_leaves_nothing(store: FragmentStore) -> None:
    class Boom(Exception):
        pass

    def source():  # type: ignore[no-untyped-def]
        yield b"x" * (6 << 20)  # past one S3 part: a multipart upload was started
        yield b"y" * (6 << 20)
        raise Boom

    with pytest.raises((Boom, StoreError)):
        store.put("j/partial", source())
    assert not store.exists("j/partial")
    assert list(store.list()) == []


def test_short_source_with_declared_length_fails(store: FragmentStore) -> None:
    with pytest.raises(StoreError):
        store.put("j/short", iter([b"abc"]), 10)
    assert not store.exists("j/short")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "../x", "./a", "a/.", "a/", "a\\b"])
def test_bad_keys_are_rejected(store: FragmentStore, key: str) -> None:
    with pytest.raises(InvalidStoreKey):
        store.put(key, b"x")
    with pytest.raises(InvalidStoreKey):
        store.get(key)
    assert isinstance(InvalidStoreKey("key", "r"), ValidationError)


def test_signed_url_fetches_the_object(store: FragmentStore) -> None:
    store.put("j/signed", b"signed content")
    url = store.signed_url("j/signed", ttl=60)
    if isinstance(store, FileStore):
        assert url.startswith("file:///")
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.read() == b"signed content"


def test_health(store: FragmentStore) -> None:
    assert store.health() >= 0
    assert not store.exists(HEALTH_KEY)


def test_dot_quire_keys_are_allowed(store: FragmentStore) -> None:
    store.put(".quire/index/a/j/manifest.json", b"{}")
    assert [i.key for i in store.list(".quire/")] == [".quire/index/a/j/manifest.json"]


# -- backend specifics ------------------------------------------------------------------

def test_file_store_is_atomic_and_confined(tmp_path: Path) -> None:
    root = tmp_path / "root"
    st = FileStore(root.as_uri() + "/")
    (tmp_path / "outside").mkdir()
    (root / "j").mkdir(parents=True)
    (root / "j" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(StoreError):
        st.put("j/link/escape", b"x")
    assert list((tmp_path / "outside").iterdir()) == []
    # Temp files are invisible to listings.
    (root / "j" / ".quire-tmp-abc").write_bytes(b"partial")
    assert [i.key for i in st.list("j/")] == []


def test_file_store_missing_root(tmp_path: Path) -> None:
    st = FileStore((tmp_path / "gone").as_uri() + "/", create=False)
    with pytest.raises(StoreNotFound):
        st.put("a/b", b"x")


def test_s3_store_config_and_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECRETID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "supersecretvalue")
    st = S3Store("s3://my-bucket/some/prefix/")
    assert (st.bucket, st.prefix, st.endpoint, st.secure) == ("my-bucket", "some/prefix/", "127.0.0.1:9", False)
    assert "supersecretvalue" not in repr(st) and "AKIASECRETID" not in repr(st)
    monkeypatch.setenv("QUIRE_S3_ENDPOINT", "https://minio.example:9000")
    st = S3Store("s3://my-bucket/")
    assert (st.endpoint, st.secure, st.prefix) == ("minio.example:9000", True, "")
    assert S3Store("s3://my-bucket/", endpoint="127.0.0.9:9000", secure=False).endpoint == "127.0.0.9:9000"
    with pytest.raises(ValidationError):
        S3Store("s3://Bad_Bucket/")


def test_s3_store_unreachable_is_unavailable() -> None:
    st = S3Store("s3://bucket/", endpoint="http://127.0.0.1:9", access_key="a", secret_key="b",
                 retries=0, connect_timeout=1, read_timeout=1)
    for op in (lambda: st.stat("x"), lambda: st.put("x", b"1"), lambda: list(st.list()),
               lambda: st.get("x"), lambda: st.delete("x")):
        with pytest.raises(StoreUnavailable) as info:
            op()
        assert info.value.retriable


def test_s3_missing_bucket(s3_store_factory, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    st = s3_store_factory(bucket_name=s3_bucket.name + "-missing")
    with pytest.raises(StoreNotFound):
        st.put("a/b", b"x")
    with pytest.raises(StoreNotFound):
        list(st.list())


def test_s3_offload_object_is_stored_gzip_encoded(s3_store_factory, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    import gzip

    st = s3_store_factory(prefix="")
    body = gzip.compress(b"offload me " * 100)
    st.put("j/offload", body, content_encoding="gzip")
    head = s3_bucket.client.stat_object(s3_bucket.name, "j/offload")
    assert head.metadata.get("Content-Encoding") == "gzip"
    assert st.read_all("j/offload") == body  # never transparently inflated


def test_open_store_caches_per_url(tmp_path: Path) -> None:
    url = tmp_path.as_uri() + "/"
    try:
        a, b = open_store(url), open_store(url)
        assert a is b and isinstance(a, FileStore)
        assert open_store(url, fsync=False) is not a
        assert isinstance(open_store("s3://bucket/x/", endpoint="127.0.0.1:9"), S3Store)
        with pytest.raises(ValidationError):
            open_store("gs://bucket/")
        with pytest.raises(ValidationError):
            open_store("file:///no/trailing/slash")
    finally:
        clear_store_cache()


def test_errors_pickle() -> None:
    err = FragmentNotFound("no such object", "s3://b/", "j/k")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is FragmentNotFound and str(back) == str(err) and back.key == "j/k"


def test_delete_many_removes_only_the_keys_given(store: FragmentStore) -> None:
    keys = [f"j/{i:04d}" for i in range(1205)] if isinstance(store, S3Store) \
        else [f"j/{i:04d}" for i in range(30)]  # S3: more than one DeleteObjects batch
    for k in keys:
        store.put(k, b"x")
    store.put("j2/keep", b"y")
    gone = keys[:-1] + ["j/absent"]  # an absent key is not an error
    assert store.delete_many(gone) == gone
    assert [i.key for i in store.list()] == [keys[-1], "j2/keep"]
    assert store.delete_many(gone) == gone  # idempotent: a second run finds nothing
