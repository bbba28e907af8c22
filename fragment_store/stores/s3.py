"""A fragment store in an S3 bucket (MinIO, AWS, moto): `s3://bucket/prefix/`.

Talks S3 through the `minio` client (<8, always called with keywords). The endpoint and
credentials come from explicit arguments, else the environment:

    endpoint    QUIRE_S3_ENDPOINT, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL  (default AWS)
    access key  QUIRE_S3_ACCESS_KEY, AWS_ACCESS_KEY_ID
    secret key  QUIRE_S3_SECRET_KEY, AWS_SECRET_ACCESS_KEY
    region      QUIRE_S3_REGION, AWS_REGION, AWS_DEFAULT_REGION             (default us-east-1)
    secure      the endpoint's scheme, else QUIRE_S3_SECURE                 (default true)

Credentials are never logged; `repr()` masks them. Every request has connect and read
timeouts and a bounded retry budget; failures become StoreError subclasses. Objects
larger than `part_size`, or of unknown length, are uploaded multipart; an upload whose
source raises is aborted, so nothing becomes visible under the key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError

from protocol import QuireError, validate_store_url

from ..errors import (
    FragmentNotFound,
    StoreAccessDenied,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
)
from .base import READ_CHUNK, ChunkFile, Data, FragmentStore, ObjectInfo, check_key, check_prefix

MIN_PART_SIZE = 5 << 20
DELETE_BATCH = 1000
"""Keys per DeleteObjects request (the S3 maximum)."""
DELETE_ATTEMPTS = 3
DEFAULT_PART_SIZE = 16 << 20

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
           "InvalidToken", "AllAccessDisabled", "AccountProblem"}
_UNAVAILABLE = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout",
                "RequestTimeTooSkewed"}


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _truthy(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def map_error(exc: BaseException, url: str, key: str = "") -> QuireError:
    """The StoreError for an exception out of minio/urllib3 (QuireErrors pass through)."""
    if isinstance(exc, QuireError):
        return exc
    if isinstance(exc, S3Error):
        code = exc.code or ""
        if code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound") and key:
            return FragmentNotFound("no such object", url, key)
        if code == "NoSuchBucket":
            return StoreNotFound("no such bucket", url, key)
        if code in _DENIED:
            return StoreAccessDenied(f"S3 {code}", url, key)
        if code in _UNAVAILABLE:
            return StoreUnavailable(f"S3 {code}", url, key)
        return StoreError(f"S3 {code}: {exc.message}", url, key)
    if isinstance(exc, ServerError):
        return StoreUnavailable(f"S3 server error {exc.status_code}", url, key)
    if isinstance(exc, (InvalidResponseError, MinioException, urllib3.exceptions.HTTPError,
                        OSError, TimeoutError)):
        return StoreUnavailable(f"{type(exc).__name__}: {exc}"[:500], url, key)
    return StoreError(f"{type(exc).__name__}: {exc}"[:500], url, key)


class S3Store(FragmentStore):
    def __init__(self, url: str, *, endpoint: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, session_token: str | None = None,
                 region: str | None = None, secure: bool | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 30.0, retries: int = 3,
                 part_size: int = DEFAULT_PART_SIZE) -> None:
        validate_store_url(url, "store")
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise StoreError("not an s3:// URL", url)
        query = dict(parse_qsl(parts.query))
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.lstrip("/")  # "" or "a/b/"
        endpoint = endpoint or query.get("endpoint") or _env(
            "QUIRE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
        if "://" in endpoint:
            ep = urlsplit(endpoint)
            if secure is None:
                secure = ep.scheme == "https"
            endpoint = ep.netloc
        if secure is None:
            env_secure = query.get("secure") or _env("QUIRE_S3_SECURE")
            secure = _truthy(env_secure) if env_secure is not None else True
        self.endpoint = endpoint
        self.secure = secure
        self.region = region or query.get("region") or _env(
            "QUIRE_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1"
        self._access_key = access_key or _env("QUIRE_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
        secret = secret_key or _env("QUIRE_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY")
        token = session_token or _env("AWS_SESSION_TOKEN")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum {MIN_PART_SIZE}")
        self.part_size = part_size
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            maxsize=16,
            retries=urllib3.Retry(total=retries, backoff_factor=0.2,
                                  status_forcelist=(500, 502, 503, 504)),
            **_tls_options(secure),
        )
        self._client = Minio(endpoint=endpoint, access_key=self._access_key, secret_key=secret,
                             session_token=token, secure=secure, region=self.region,
                             http_client=http)

    def __repr__(self) -> str:
        masked = (self._access_key or "")[:2] + "***" if self._access_key else None
        return (f"S3Store({self.url!r}, endpoint={self.endpoint!r}, secure={self.secure}, "
                f"access_key={masked!r})")

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put(self, key: str, data: Data, length: int = -1,
            content_encoding: str | None = None) -> ObjectInfo:
        name = self._name(key)
        metadata = {"Content-Encoding": content_encoding} if content_encoding else None
        if isinstance(data, (bytes, bytearray, memoryview)):
            length = len(data)
        src = ChunkFile(data)
        try:
            if 0 <= length <= self.part_size:
                self._client.put_object(bucket_name=self.bucket, object_name=name, data=src,
                                        length=length, metadata=metadata)
            else:
                self._client.put_object(bucket_name=self.bucket, object_name=name, data=src,
                                        length=-1, part_size=self.part_size, metadata=metadata)
        except Exception as exc:
            raise map_error(exc, self.url, key) from None
        return self.stat(key)

    def stat(self, key: str) -> ObjectInfo:
        try:
            st = self._client.stat_object(bucket_name=self.bucket, object_name=self._name(key))
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound"):
                raise FragmentNotFound("no such object", self.url, key) from None
            raise map_error(exc, self.url, key) from None
        except Exception as exc:
            raise map_error(exc, self.url, key) from None
        mod = int(st.last_modified.timestamp()) if st.last_modified else 0
        return ObjectInfo(key, int(st.size or 0), mod)

    def get(self, key: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        name = self._name(key)
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"bad range offset={offset} length={length}")
        if length == 0:
            return iter(())
        try:
            resp = self._client.get_object(bucket_name=self.bucket, object_name=name,
                                           offset=offset, length=length or 0)
        except S3Error as exc:
            if exc.code == "InvalidRange":  # offset at or past the end
                return iter(())
            raise map_error(exc, self.url, key) from None
        except Exception as exc:
            raise map_error(exc, self.url, key) from None
        return self._stream(resp, key)

    def _stream(self, resp, key: str) -> Iterator[bytes]:  # type: ignore[no-untyped-def]
        try:
            # decode_content=False: a gzip-offload object (Content-Encoding: gzip) must
            # reach the codec still compressed.
            yield from resp.stream(READ_CHUNK, decode_content=False)
        except Exception as exc:
            raise map_error(exc, self.url, key) from None
        finally:
            resp.close()
            resp.release_conn()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        strip = len(self.prefix)
        try:
            # list_objects pages lazily (1000 keys per request) in key order.
            for obj in self._client.list_objects(bucket_name=self.bucket,
                                                 prefix=self.prefix + prefix, recursive=True):
                if obj.is_dir:
                    continue
                mod = int(obj.last_modified.timestamp()) if obj.last_modified else 0
                yield ObjectInfo(obj.object_name[strip:], int(obj.size or 0), mod)
        except Exception as exc:
            raise map_error(exc, self.url, prefix) from None

    def delete(self, key: str) -> None:
        try:
            self._client.remove_object(bucket_name=self.bucket, object_name=self._name(key))
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                return
            raise map_error(exc, self.url, key) from None
        except Exception as exc:
            raise map_error(exc, self.url, key) from None

    def delete_many(self, keys: Iterable[str]) -> list[str]:
        """DeleteObjects in batches of DELETE_BATCH; keys that fail (other than absent
        ones) are retried up to DELETE_ATTEMPTS times, then StoreError names the first."""
        asked = [check_key(k) for k in keys]
        for start in range(0, len(asked), DELETE_BATCH):
            pending = asked[start:start + DELETE_BATCH]
            for attempt in range(DELETE_ATTEMPTS):
                try:
                    errors = list(self._client.remove_objects(
                        bucket_name=self.bucket,
                        delete_object_list=[DeleteObject(self._name(k)) for k in pending]))
                except Exception as exc:
                    if attempt + 1 == DELETE_ATTEMPTS:
                        raise map_error(exc, self.url, pending[0]) from None
                    continue
                strip = len(self.prefix)
                pending = [e.name[strip:] for e in errors
                           if e.code not in ("NoSuchKey", "NoSuchObject")]
                if not pending:
                    break
            else:
                raise StoreUnavailable(f"DeleteObjects failed for {len(pending)} keys after "
                                       f"{DELETE_ATTEMPTS} attempts", self.url, pending[0])
        return asked

    def quarantine(self, key: str, target: str, *, keep_original: bool = False) -> None:
        """Move an object to `target`: a server-side copy, then the original removed
        (unless `keep_original`)."""
        from minio.commonconfig import CopySource

        try:
            self._client.copy_object(bucket_name=self.bucket, object_name=self._name(target),
                                     source=CopySource(self.bucket, self._name(key)))
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                raise FragmentNotFound("no such object", self.url, key) from None
            raise map_error(exc, self.url, key) from None
        except Exception as exc:
            raise map_error(exc, self.url, key) from None
        if not keep_original:
            self.delete(key)

    def signed_url(self, key: str, ttl: float = 60.0) -> str:
        try:
            return self._client.presigned_get_object(
                bucket_name=self.bucket, object_name=self._name(key),
                expires=timedelta(seconds=max(1, int(ttl))))
        except Exception as exc:
            raise map_error(exc, self.url, key) from None

    def close(self) -> None:
        self._client._http.clear()  # noqa: SLF001 - the pool we created


def _tls_options(secure: bool) -> dict[str, str]:
    if not secure:
        return {}
    ca = os.environ.get("SSL_CERT_FILE")
    if not ca:
        try:
            import certifi

            ca = certifi.where()
        except ImportError:  # pragma: no cover
            return {"cert_reqs": "CERT_REQUIRED"}
    return {"cert_reqs": "CERT_REQUIRED", "ca_certs": ca}
