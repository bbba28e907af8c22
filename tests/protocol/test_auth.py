"""The pure authorizer: tokens, bad tokens, scopes and the RPC → capability table."""

from __future__ import annotations

import base64
import json
import os
import stat
import time

import jwt
import pytest

from protocol import (
    AppendRequest,
    ApplyRequest,
    FetchFragmentRequest,
    Fragment,
    JournalSpec,
    LabelSet,
    ListBrokersRequest,
    ListFragmentsRequest,
    ListRequest,
    ReadRequest,
    ReplicateProposal,
    ValidationError,
)
from protocol.auth import (
    MAX_TOKEN_BYTES,
    RPC_CAPABILITY,
    Capability,
    Keyring,
    Scope,
    TokenError,
    authorize,
    authorize_apply,
    decode_keys,
    parse_caps,
    requirement,
)
from protocol.credentials import TokenFile, current_token, load_keyring

K1, K2 = os.urandom(32), os.urandom(32)
RING = Keyring([K1])


def b64(k: bytes) -> str:
    return base64.b64encode(k).decode()


def tok(caps: str = "append,read", pfx=("team-a/",), ttl: float = 3600, ring: Keyring = RING,
        sel: str | None = None, now: float | None = None) -> str:
    return ring.mint(parse_caps(caps), Scope.of(pfx, sel), ttl, "alice", now=now)


def raw(claims: dict, key: bytes = K1, alg: str = "HS256", headers: dict | None = None) -> str:
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def good_claims(**kw) -> dict:  # noqa: ANN003
    now = int(time.time())
    c = {"sub": "alice", "aud": "quire", "iat": now, "nbf": now, "exp": now + 600,
         "cap": ["append"], "pfx": ["team-a/"]}
    c.update(kw)
    return {k: v for k, v in c.items() if v is not None}


# -- tokens -------------------------------------------------------------------------------

def test_mint_verify_round_trip() -> None:
    claims = RING.verify(tok())
    assert claims.subject == "alice"
    assert claims.caps == Capability.APPEND | Capability.READ
    assert claims.scope.prefixes == ("team-a/",)


def test_every_key_verifies_and_the_first_signs() -> None:
    old = Keyring([K2]).mint(Capability.READ, Scope.of(["*"]), 60, "old")
    rotated = Keyring([K1, K2])
    assert rotated.verify(old).subject == "old"  # signed with the retiring key
    new = rotated.mint(Capability.READ, Scope.of(["*"]), 60, "new")
    assert Keyring([K1]).verify(new).subject == "new"
    with pytest.raises(TokenError, match="no key"):
        Keyring([K2]).verify(new)


def _alg_none() -> str:
    def enc(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return enc({"alg": "none", "typ": "JWT"}) + "." + enc(good_claims()) + "."


BAD_TOKENS = {
    "empty": lambda: "",
    "not a string": lambda: 12345,
    "malformed": lambda: "not.a.jwt",
    "garbage": lambda: "x" * 100,
    "truncated": lambda: tok()[:-10],
    "1 MB": lambda: "a" * (1 << 20),
    "alg none": _alg_none,
    "HS512": lambda: raw(good_claims(), key=K1 * 2, alg="HS512"),
    "wrong key": lambda: raw(good_claims(), key=K2),
    "expired": lambda: raw(good_claims(iat=int(time.time()) - 7200, nbf=int(time.time()) - 7200,
                                       exp=int(time.time()) - 3600)),
    "not yet valid": lambda: raw(good_claims(nbf=int(time.time()) + 3600)),
    "issued in the future": lambda: raw(good_claims(iat=int(time.time()) + 3600,
                                                    exp=int(time.time()) + 7200)),
    "no exp": lambda: raw(good_claims(exp=None)),
    "no sub": lambda: raw(good_claims(sub=None)),
    "wrong aud": lambda: raw(good_claims(aud="other-cluster")),
    "cap as string": lambda: raw(good_claims(cap="append")),
    "unknown cap": lambda: raw(good_claims(cap=["root"])),
    "empty cap": lambda: raw(good_claims(cap=[])),
    "empty prefix": lambda: raw(good_claims(pfx=[""])),
    "no scope": lambda: raw(good_claims(pfx=None)),
    "empty selector": lambda: raw(good_claims(pfx=None, sel="  ")),
    "traversal prefix": lambda: raw(good_claims(pfx=["team-a/../"])),
    "pfx as string": lambda: raw(good_claims(pfx="team-a/")),
    "too long-lived": lambda: raw(good_claims(exp=int(time.time()) + 30 * 86400)),
}


@pytest.mark.parametrize("name", sorted(BAD_TOKENS))
def test_bad_tokens_are_refused(name: str) -> None:
    with pytest.raises(TokenError) as info:
        RING.verify(BAD_TOKENS[name]())
    assert len(str(info.value)) < 200  # says why, never echoes the token


def test_rs256_header_is_refused_without_trying_it() -> None:
    header = base64.urlsafe_b64encode(b'{"alg":"RS256","typ":"JWT"}').rstrip(b"=").decode()
    with pytest.raises(TokenError, match="algorithm"):
        RING.verify(header + ".e30.c2ln")


def test_oversized_is_refused_before_parsing() -> None:
    with pytest.raises(TokenError, match=str(MAX_TOKEN_BYTES)):
        RING.verify("." * (MAX_TOKEN_BYTES + 1))


def test_small_clock_skew_is_tolerated() -> None:
    now = time.time()
    RING.verify(raw(good_claims(iat=int(now) + 3, nbf=int(now) + 3)))
    RING.verify(raw(good_claims(iat=int(now) - 600, nbf=int(now) - 600, exp=int(now) - 2)))


def test_keys_are_checked_and_never_printed(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValidationError, match="at least 32"):
        decode_keys(b64(b"short"))
    with pytest.raises(ValidationError, match="base64"):
        decode_keys("!!!not base64!!!")
    ring = load_keyring(f"{b64(K1)},{b64(K2)}", None)
    assert ring is not None and b64(K1) not in repr(ring) and "2 keys" in repr(ring)
    assert load_keyring(None, None) is None
    f = tmp_path / "keys"
    f.write_text(b64(K1) + "\n" + b64(K2) + "\n")
    f.chmod(0o644)
    with pytest.raises(ValidationError, match="chmod 600"):
        load_keyring(None, str(f))
    f.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert load_keyring(None, str(f)).verify(tok()).subject == "alice"  # type: ignore[union-attr]


def test_parse_caps() -> None:
    assert parse_caps("APPEND, read") == Capability.APPEND | Capability.READ
    assert parse_caps(["shards"]) == Capability.SHARDS
    for bad in ("", "append,root", ","):
        with pytest.raises(ValidationError):
            parse_caps(bad)


# -- scope ------------------------------------------------------------------------------

def test_prefixes_match_whole_segments_and_exact_names() -> None:
    s = Scope.of(["team-a/", "ops/audit"])
    assert s.covers("team-a/x", None) and s.covers("team-a/b/c", None)
    assert not s.covers("team-ab/x", None) and not s.covers("team-a", None)
    assert s.covers("ops/audit", None) and not s.covers("ops/audit2", None)
    assert not s.covers("ops/audit/x", None)
    assert not s.covers("team-a/../team-b/x", None)  # not a valid name: in no scope
    assert Scope.of(["*"]).covers("any/journal", None)


def test_selector_scope_uses_labels_and_meta_labels() -> None:
    s = Scope.of((), "team=a, !secret")
    assert s.covers("x/one", LabelSet.of(team="a"))
    assert not s.covers("x/one", LabelSet.of(team="b"))
    assert not s.covers("x/one", LabelSet.of(team="a", secret="yes"))
    assert not s.covers("x/one", None)  # an unknown journal has no labels
    assert Scope.of((), "prefix=logs/").covers("logs/app", None)
    both = Scope.of(["team-a/"], "tier=hot")  # both must hold
    assert both.covers("team-a/x", LabelSet.of(tier="hot"))
    assert not both.covers("team-b/x", LabelSet.of(tier="hot"))
    assert RING.verify(tok(pfx=(), sel="team=a")).scope.selector is not None


# -- the RPC table ----------------------------------------------------------------------

FRAG = Fragment(journal="team-a/j1", begin=0, end=0)
REQUESTS = {
    AppendRequest: AppendRequest(journal="team-a/j1"),
    ReadRequest: ReadRequest(journal="team-a/j1"),
    ListFragmentsRequest: ListFragmentsRequest(journal="team-a/j1"),
    FetchFragmentRequest: FetchFragmentRequest(fragment=FRAG),
    ReplicateProposal: ReplicateProposal(proposal=FRAG),
    ListRequest: ListRequest(),
    ListBrokersRequest: ListBrokersRequest(),
    ApplyRequest: ApplyRequest(),
}


def test_every_rpc_has_a_capability() -> None:
    assert set(REQUESTS) == set(RPC_CAPABILITY)
    for cls, msg in REQUESTS.items():
        cap, journal = requirement(msg)
        assert cap == RPC_CAPABILITY[cls]
        assert journal == ("team-a/j1" if cls not in (ListRequest, ListBrokersRequest, ApplyRequest)
                           else None)
    with pytest.raises(ValidationError):
        requirement(object())


@pytest.mark.parametrize("cls", list(REQUESTS), ids=lambda c: c.__name__)
def test_authorize_each_rpc(cls: type) -> None:
    need = RPC_CAPABILITY[cls]
    msg = REQUESTS[cls]
    others = [c for c in Capability if c != need]
    assert authorize(RING.verify(tok(need.name.lower())), msg) is None
    refusal = authorize(RING.verify(tok(",".join(c.name.lower() for c in others))), msg)
    assert refusal is not None and refusal.capability == need
    assert need.name in refusal.message
    if requirement(msg)[1] is not None:
        out = authorize(RING.verify(tok(need.name.lower(), pfx=("team-b/",))), msg)
        assert out is not None and out.journal == "team-a/j1" and "team-a/j1" in out.message


def test_apply_needs_scope_for_current_and_new_spec() -> None:
    c = RING.verify(tok("apply", pfx=(), sel="team=a"))
    a = JournalSpec(name="x/jj", labels=LabelSet.of(team="a"))
    b = JournalSpec(name="x/jj", labels=LabelSet.of(team="b"))
    assert authorize_apply(c, [("x/jj", None, a)]) is None  # create inside the scope
    assert authorize_apply(c, [("x/jj", a, a)]) is None
    assert authorize_apply(c, [("x/jj", a, b)]) is not None  # moved out of the scope
    assert authorize_apply(c, [("x/jj", b, a)]) is not None  # taken from another team
    assert authorize_apply(c, [("x/jj", a, None)]) is None  # delete of our own
    assert authorize_apply(c, [("x/jj", b, None)]) is not None
    no_apply = RING.verify(tok("list", pfx=("*",)))
    assert authorize_apply(no_apply, [("x/jj", None, a)]) == (Capability.APPLY, None)


def docs_rpc_table() -> dict[str, str]:
    """message name → capability name, from docs/security.md's RPC table."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    body = text.split("<!-- rpc-capabilities:begin -->")[1].split("<!-- rpc-capabilities:end -->")[0]
    out = {}
    for line in body.strip().splitlines()[2:]:
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        out[cells[1]] = cells[2]
    return out


def test_the_docs_table_is_the_code_table() -> None:
    assert docs_rpc_table() == {cls.__name__: cap.name for cls, cap in RPC_CAPABILITY.items()}


# -- property: prefix scopes against a segment oracle ------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SEGMENT = st.sampled_from(["team-a", "team-ab", "team", "a", "b", "x1", "logs", "..", ".hid"])


def _oracle(prefix: str, name: str) -> bool:
    """Whole-segment prefix match over valid names; exact names; '*'."""
    parts = name.split("/")
    if len(name) < 4 or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return False
    if prefix == "*":
        return True
    if prefix.endswith("/"):
        want = prefix[:-1].split("/")
        return len(parts) > len(want) and parts[:len(want)] == want
    return prefix == name


@settings(max_examples=400, deadline=None)
@given(st.lists(SEGMENT, min_size=1, max_size=3), st.lists(SEGMENT, min_size=1, max_size=4),
       st.sampled_from(["prefix", "exact", "star"]))
def test_prefix_scopes_match_the_segment_oracle(pfx_parts: list[str], name_parts: list[str],
                                                kind: str) -> None:
    prefix = {"prefix": "/".join(pfx_parts) + "/", "exact": "/".join(pfx_parts), "star": "*"}[kind]
    name = "/".join(name_parts)
    try:
        scope = Scope.of([prefix])
    except ValidationError:
        assert kind != "star"  # only unclean prefixes (`..`, `.hid`, too short) are refused
        return
    assert scope.covers(name, None) == _oracle(prefix, name), (prefix, name)


def test_a_token_file_is_re_read_when_it_changes(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "token"
    source = TokenFile(str(path))
    assert source() == ""  # missing: no token (the coordinator answers UNAUTHORIZED)
    path.write_text(tok() + "\n")
    assert RING.verify(current_token(source)).subject == "alice"
    newer = RING.mint(Capability.READ, Scope.of(["*"]), 60, "bob")
    path.write_text(newer + "\n")
    os.utime(path, (time.time() + 5, time.time() + 5))  # a distinct mtime, whatever the fs
    assert RING.verify(source()).subject == "bob"
    assert current_token("plain") == "plain" and str(tmp_path) in repr(source)
