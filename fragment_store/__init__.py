"""quire's fragment store layer: keys, codecs, stores, persistence and the index.

Layer 2: imports `protocol` and third-party libraries only.

    keys      content-addressed object keys (fragment_key / parse_key)
    codecs    none / gzip / zstd / snappy / gzip-offload, streaming
    stores    FragmentStore (file://, s3://) and open_store(url)
    persist   persist_fragment / list_fragments[_stats] / store_stats (and the unproven stream_unverified)
    proof     prove / prove_stored: the SHA-1 proof, quarantine, metrics
    index     CoverSet — the covering set of a journal's fragments
    prune     plan_prune — which fragments retention and guards allow removing
    verified  read_fragment / read_verified — the one verifying reader (proof before any byte, fallback
              to other copies, quarantine, mend); FragmentCorrupt
    readahead ReadAhead / read_fragments — a sequence of fragments, the next proven while one is used
    stats     StoreStats — a journal's fragment count, stored bytes, times, offsets
    manifest  the index manifest batch readers read from the store
    errors    the StoreError / CodecError / InvalidFragmentKey tree
"""

from .codecs import compress, compress_chunks, compressor, decompress, decompress_chunks
from .errors import (
    ChecksumMismatch,
    CodecError,
    FragmentNotFound,
    InvalidFragmentKey,
    InvalidStoreKey,
    StoreAccessDenied,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
)
from .index import CoverSet, decode_index, encode_index, merge
from .keys import EXTENSION, extension, fragment_key, fragment_name, journal_prefix, parse_key, parse_name
from .manifest import Manifest, manifest_key, read_manifest, write_manifest
from .persist import (
    content_encoding,
    delete_fragment,
    fragment_url,
    list_fragments,
    list_fragments_stats,
    persist_fragment,
)
from .verified import (
    FragmentCorrupt,
    prove_stored,
    quarantine,
    read_fragment,
    read_verified,
    verify_stored,
)
from .readahead import ReadAhead, read_fragments
from .stores import (
    HEALTH_KEY,
    FileStore,
    FragmentStore,
    ObjectInfo,
    S3Store,
    clear_store_cache,
    open_store,
)

__all__ = [
    "EXTENSION", "HEALTH_KEY", "ChecksumMismatch", "FragmentCorrupt", "prove_stored", "quarantine",
    "read_verified", "verify_stored", "CodecError", "CoverSet", "FileStore",
    "FragmentNotFound", "FragmentStore", "InvalidFragmentKey", "InvalidStoreKey", "Manifest",
    "ObjectInfo", "S3Store", "StoreAccessDenied", "StoreError", "StoreNotFound",
    "StoreUnavailable", "clear_store_cache", "compress", "compress_chunks", "compressor",
    "content_encoding", "decode_index", "decompress", "decompress_chunks", "delete_fragment",
    "encode_index", "extension", "fragment_key", "fragment_name", "fragment_url",
    "journal_prefix", "list_fragments", "list_fragments_stats", "manifest_key", "merge", "open_store", "parse_key",
    "parse_name", "persist_fragment", "read_fragment", "read_fragments", "read_manifest",
    "write_manifest", "ReadAhead",
]
