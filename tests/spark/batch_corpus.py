"""Journals written straight into a store, for the batch (spark/) tests.

Until a coordinator writes journals, tests persist fragments with
`fragment_store.persist_fragment`: generated content cut into uneven fragments at
arbitrary byte positions (so messages span fragments), cycling through every codec.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

CODECS = ("none", "gzip", "zstd", "snappy")


@dataclass
class StoreUnderTest:
    url: str
    options: dict[str, str]
    """Data source options that reach this store from any process (s3.* credentials)."""
    kind: str

    def store(self) -> Any:
        from fragment_store import open_store

        kw = {"endpoint": self.options["s3.endpoint"], "access_key": self.options["s3.accessKey"],
              "secret_key": self.options["s3.secretKey"]} if self.kind == "s3" else {}
        return open_store(self.url, **kw)

    def dask_options(self) -> dict[str, str]:
        return dict(self.options)


def json_lines(rng: random.Random, n: int, *, hours: int = 3, keys: int = 5,
               long_every: int = 0) -> bytes:
    """n JSON-lines messages; every `long_every`-th carries a long payload."""
    out = []
    for i in range(n):
        msg = {"key": f"k{rng.randrange(keys)}", "n": i,
               "ts": f"2026-01-01T{rng.randrange(hours):02d}:{rng.randrange(60):02d}:00Z",
               "pad": "x" * rng.randrange(40)}
        if long_every and i % long_every == 0:
            msg["pad"] = "y" * rng.randrange(2000, 6000)
        out.append(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
    return b"".join(out)


def persist_journal(store: Any, journal: str, content: bytes, cuts: list[int],
                    codecs: tuple[str, ...] = CODECS, start: int = 0) -> list[Any]:
    """Persist content[cut_i:cut_i+1] as fragments (journal offsets start at `start`)."""
    from fragment_store import persist_fragment
    from protocol import Codec, Fragment

    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(content))), len(content)]
    frags = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        chunk = content[a:b]
        frag = Fragment(journal=journal, begin=start + a, end=start + b,
                        sum=hashlib.sha1(chunk).hexdigest(), codec=Codec(codecs[i % len(codecs)]))
        # Feed the content in uneven chunks too.
        pieces = [chunk[j:j + 777] for j in range(0, len(chunk), 777)]
        frags.append(persist_fragment(store, frag, pieces))
    return frags


def random_cuts(rng: random.Random, length: int, n: int) -> list[int]:
    return sorted(rng.sample(range(1, length), min(n, length - 1)))


def expected_messages(content: bytes, begin: int = 0, end: int | None = None,
                      start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of the messages starting in [begin, end) of `content` placed at
    journal offset `start`; `begin` itself counts as a message start."""
    out = []
    stop = len(content) if end is None else end - start
    s = max(begin, start) - start
    while s < min(stop, len(content)):
        j = content.find(b"\n", s)
        j = len(content) if j < 0 else j
        out.append((s + start, content[s:j]))
        s = j + 1
    return out




@dataclass
class Corpus:
    store: StoreUnderTest
    contents: dict[str, bytes]
    fragments: dict[str, list[Any]]


def build_corpus(sut: StoreUnderTest, seed: int = 7,
                 sizes: dict[str, int] | None = None) -> Corpus:
    """Several journals of JSON lines, uneven fragments, every codec, long messages that
    span several fragments."""
    rng = random.Random(seed)
    store = sut.store()
    sizes = sizes or {"topics/clicks/part-000": 900, "topics/clicks/part-001": 400,
                      "topics/views/part-000": 250}
    contents, frags = {}, {}
    for journal, n in sizes.items():
        content = json_lines(rng, n, long_every=97)
        cuts = random_cuts(rng, len(content), max(3, len(content) // 4000))
        # Tiny fragments inside a long message, and one cut right after a newline.
        cuts += [content.index(b"yyy") + k for k in (5, 9, 40)]
        cuts.append(content.index(b"\n", len(content) // 2) + 1)
        r = rng.randrange(4)
        frags[journal] = persist_journal(store, journal, content, cuts, CODECS[r:] + CODECS[:r])
        contents[journal] = content
    return Corpus(store=sut, contents=contents, fragments=frags)
