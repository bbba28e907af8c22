"""`quire read --from-store` against an S3 store hands the client a presigned HTTP URL:
the client proves what it fetched there too, before yielding a byte."""

from __future__ import annotations

import hashlib

import pytest

from fragment_store import FragmentCorrupt, fragment_key, persist_fragment
from protocol import Codec, Fragment
from quire.client.store_reader import read_fragment_url
from tests.fragment_store.conftest import make_s3_store
from tests.fragment_store.rot import ROT_CODECS, flip_byte


async def collect(url: str, f: Fragment, offset: int) -> bytes:
    return b"".join([c async for c in read_fragment_url(url, f, offset)])


@pytest.mark.parametrize("codec", ROT_CODECS)
async def test_a_presigned_url_is_proven_before_a_byte(s3, s3_bucket, codec: str) -> None:  # noqa: ANN001
    store = make_s3_store(s3, s3_bucket, f"presigned-{codec}/")
    try:
        content = b"".join(b"line %d of the fragment\n" % i for i in range(3000))
        f = persist_fragment(store, Fragment(journal="presigned/j", begin=0, end=len(content),
                                             sum=hashlib.sha1(content).hexdigest(),
                                             codec=Codec(codec)), content)
        url = store.signed_url(fragment_key(f))
        assert url.startswith("http")
        assert await collect(url, f, 100) == content[100:]
        flip_byte(store, fragment_key(f))
        got: list[bytes] = []
        with pytest.raises(FragmentCorrupt) as err:
            async for chunk in read_fragment_url(store.signed_url(fragment_key(f)), f, 0):
                got.append(chunk)
        assert got == [] and err.value.journal == "presigned/j"
        if codec == "none":  # what the option risks: the rotten byte is handed on
            unproven = b"".join([c async for c in read_fragment_url(
                store.signed_url(fragment_key(f)), f, 0, unverified_reads_risk_corruption=True)])
            assert len(unproven) == len(content) and unproven != content
    finally:
        store.close()
