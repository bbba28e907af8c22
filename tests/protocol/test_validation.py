from __future__ import annotations

import pickle

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    Codec,
    Fragment,
    FragmentSpec,
    JournalSpec,
    Label,
    LabelSelector,
    LabelSet,
    ProcessId,
    Status,
    StatusError,
    Suspend,
    ValidationError,
    for_status,
    parse_duration,
    parse_selector,
    raise_for_status,
    validate_journal_name,
    validate_store_url,
)
from protocol.names import validate_suffix, validate_zone

# -- journal names ----------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "abcd", "a/b/c", "logs/eu-west/clicks_v2", "x.y+z", "date=2024-01-01/p%20", "ünïcödé/ĵournal",
    "a" * 512, "a/" * 255 + "ab", "日本語ジャーナル",
])
def test_valid_journal_names(name: str) -> None:
    validate_journal_name(name)


@pytest.mark.parametrize("name,why", [
    ("abc", "length"), ("a" * 513, "length"), ("é" * 257, "length"),  # 514 UTF-8 bytes
    ("/abs/path", "begin with '/'"), ("a/../b", "clean"), ("../ab", "clean"), ("a/./b", "clean"),
    ("a//b", "clean"), ("abcd/", "clean"), ("a/.hidden", "'.'"), (".quire/x", "'.'"),
    ("a/b c", "invalid character"), ("a;meta", "invalid character"), ("a#b#c", "invalid character"),
    ("a\nbcd", "invalid character"), ("a\\bcd", "invalid character"), ("a:bcd", "invalid character"),
    ("abc\x00", "invalid character"), ("a*bc", "invalid character"),
])
def test_invalid_journal_names(name: str, why: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_journal_name(name, "spec.name")
    assert info.value.path == "spec.name"
    assert why in info.value.reason
    assert str(info.value).startswith("spec.name: ")


def test_non_string_name() -> None:
    with pytest.raises(ValidationError):
        validate_journal_name(1234)  # type: ignore[arg-type]


def test_zone_and_suffix_alphabets() -> None:
    validate_zone("us-east-1a")
    validate_suffix("broker-0001")
    for bad in ("a/b", "a#b", "", "z" * 33):
        with pytest.raises(ValidationError):
            validate_zone(bad)
    for bad in ("abc", "ab/cd", "ab#cd", "s" * 129):
        with pytest.raises(ValidationError):
            validate_suffix(bad)
    assert ProcessId.parse("zone#suffix-1") == ProcessId("zone", "suffix-1")
    with pytest.raises(ValidationError):
        ProcessId.parse("zone/x#suffix-1")


@given(st.text(max_size=40))
@settings(max_examples=500, deadline=None)
def test_journal_name_validation_never_crashes(name: str) -> None:
    try:
        validate_journal_name(name)
    except ValidationError:
        return
    # Accepted names are clean relative paths that cannot collide with `.quire/`.
    parts = name.split("/")
    assert not name.startswith("/") and "" not in parts and ".." not in parts
    assert not any(p.startswith(".") for p in parts)
    assert 4 <= len(name.encode()) <= 512


# -- labels -----------------------------------------------------------------------------

def test_label_set_validation() -> None:
    LabelSet.of({"topic": "clicks", "region": ["eu", "us"], "flag": ""}).validate()
    with pytest.raises(ValidationError) as info:
        LabelSet((Label("bb", "1"), Label("aa", "1"))).validate()
    assert info.value.path == "labels[1]"
    with pytest.raises(ValidationError) as info:
        LabelSet((Label("aa", "1"), Label("aa", "1"))).validate()
    with pytest.raises(ValidationError) as info:
        LabelSet((Label("aa", ""), Label("aa", "x"))).validate()
    assert "mixes" in info.value.reason
    with pytest.raises(ValidationError) as info:
        LabelSet.of({"x": "1"}).validate()
    assert info.value.path == "labels[0].name"
    with pytest.raises(ValidationError) as info:
        LabelSet.of({"name": "1"}).validate()
    assert "reserved" in info.value.reason
    LabelSet.of({"name": "1"}).validate(reserved=False)
    with pytest.raises(ValidationError) as info:
        LabelSet.of({"ok": "bad value"}).validate()
    assert info.value.path == "labels[0].value"
    with pytest.raises(ValidationError):
        LabelSet.of({"ok": "v" * 1025}).validate()
    LabelSet.of({"ok": "a=b/c%d"}).validate()


def test_register_union_and_subtract() -> None:
    regs = LabelSet.of({"owner": "a", "epoch": "1", "keep": "x"})
    assert regs.union(LabelSet.of({"owner": "b"})) == LabelSet.of({"owner": "b", "epoch": "1", "keep": "x"})
    assert regs.union(LabelSet.of({"owner": ["b", "c"], "new": "n"})).as_dict() == {
        "epoch": ["1"], "keep": ["x"], "new": ["n"], "owner": ["b", "c"]}
    assert regs.union(LabelSet()) == regs
    assert regs.subtract(LabelSet.of({"owner": "a"})) == LabelSet.of({"epoch": "1", "keep": "x"})
    assert regs.subtract(LabelSet.of({"owner": "other"})) == regs  # value must match
    assert regs.subtract(LabelSet.of({"epoch": ""})) == LabelSet.of({"owner": "a", "keep": "x"})
    assert regs.subtract(LabelSet.of({"absent": ""})) == regs
    # The append path applies subtract, then union.
    assert regs.subtract(LabelSet.of({"owner": ""})).union(LabelSet.of({"owner": "z"})).value("owner") == "z"


label_names = st.sampled_from(["topic", "region", "tier", "app.kubernetes.io/name", "x-y", "zz"])
label_values = st.text(alphabet="abcXYZ019-_+/.=%", min_size=1, max_size=8)
label_sets = st.lists(st.tuples(label_names, label_values), max_size=8).map(LabelSet.of)


@given(label_sets, label_sets)
@settings(max_examples=300, deadline=None)
def test_union_subtract_properties(a: LabelSet, b: LabelSet) -> None:
    u = a.union(b)
    for name in b.names():
        assert u.values(name) == b.values(name)
    for name in a.names() - b.names():
        assert u.values(name) == a.values(name)
    s = a.subtract(b)
    assert set(s.labels) == set(a.labels) - set(b.labels)
    assert list(u.labels) == sorted(set(u.labels)) and list(s.labels) == sorted(set(s.labels))


# -- selectors --------------------------------------------------------------------------

@pytest.mark.parametrize("text,include,exclude", [
    ("topic=clicks", {"topic": ["clicks"]}, {}),
    ("topic==clicks", {"topic": ["clicks"]}, {}),
    ("tier!=cold", {}, {"tier": ["cold"]}),
    ("region in (eu, us)", {"region": ["eu", "us"]}, {}),
    ("region in(eu,us)", {"region": ["eu", "us"]}, {}),
    ("region notin (eu, us)", {}, {"region": ["eu", "us"]}),
    ("deprecated", {"deprecated": [""]}, {}),
    ("!deprecated", {}, {"deprecated": [""]}),
    ("name:prefix=logs/", {"prefix": ["logs/"]}, {}),
    ("prefix=logs/eu/", {"prefix": ["logs/eu/"]}, {}),
    ("  topic = clicks ,  !dep , region in ( eu ) ", {"region": ["eu"], "topic": ["clicks"]},
     {"dep": [""]}),
    ("", {}, {}),
])
def test_selector_parse(text: str, include: dict, exclude: dict) -> None:
    sel = parse_selector(text)
    assert sel.include.as_dict() == include and sel.exclude.as_dict() == exclude
    assert parse_selector(str(sel)) == sel
    assert LabelSelector.parse(text) == sel


@pytest.mark.parametrize("text", [
    "topic=", "topic!=", "k in ()", "k in (a", "!k=v", "(x)", ",a", "a b", "k=v)", "name:prefix=logs",
    "prefix=nope", "k=a b", "x=1",  # label name too short
])
def test_selector_parse_errors(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_selector(text)


def test_selector_matching() -> None:
    labels = LabelSet.of({"topic": "clicks", "region": "eu", "flag": ""})
    assert parse_selector("topic=clicks, region in (eu, us)").matches(labels)
    assert parse_selector("flag").matches(labels)
    assert not parse_selector("!flag").matches(labels)
    assert not parse_selector("region notin (eu)").matches(labels)
    assert parse_selector("tier!=cold").matches(labels)
    assert not parse_selector("tier").matches(labels)
    assert parse_selector("name:prefix=logs/").matches_journal("logs/eu/clicks", labels)
    assert parse_selector("prefix=logs/eu/").matches_journal("logs/eu/clicks", labels)
    assert not parse_selector("prefix=logs/us/").matches_journal("logs/eu/clicks", labels)
    assert parse_selector("name=logs/eu/clicks").matches_journal("logs/eu/clicks", labels)


selectors = st.builds(
    lambda inc, exc: LabelSelector(LabelSet.of(inc), LabelSet.of(exc)),
    st.lists(st.tuples(label_names, label_values | st.just("")), max_size=5),
    st.lists(st.tuples(label_names, label_values | st.just("")), max_size=5),
).filter(lambda s: _valid(s))


def _valid(sel: LabelSelector) -> bool:
    try:
        sel.validate()
    except ValidationError:
        return False
    return True


@given(selectors)
@settings(max_examples=500, deadline=None)
def test_selector_print_parse_round_trip(sel: LabelSelector) -> None:
    assert parse_selector(str(sel)) == sel


@given(st.text(max_size=30))
@settings(max_examples=500, deadline=None)
def test_selector_parser_raises_only_validation_errors(text: str) -> None:
    try:
        sel = parse_selector(text)
    except ValidationError:
        return
    assert parse_selector(str(sel)) == sel


# -- specs ------------------------------------------------------------------------------

def spec(**kw) -> JournalSpec:  # type: ignore[no-untyped-def]
    frag = kw.pop("fragment", {})
    return JournalSpec(name=kw.pop("name", "logs/clicks"),
                       fragment=FragmentSpec(**{"stores": ("s3://bucket/quire/",), **frag}), **kw)


def test_spec_defaults_validate() -> None:
    spec().validate()
    JournalSpec(name="logs/clicks").validate()


@pytest.mark.parametrize("kw,path", [
    (dict(name="a/../b"), "name"),
    (dict(replication=0), "replication"),
    (dict(replication=6), "replication"),
    (dict(labels=LabelSet.of({"name": "x"})), "labels[0].name"),
    (dict(fragment=dict(length=1023)), "fragment.length"),
    (dict(fragment=dict(length=(1 << 34) + 1)), "fragment.length"),
    (dict(fragment=dict(refresh_interval=0.5)), "fragment.refresh_interval"),
    (dict(fragment=dict(refresh_interval=86401)), "fragment.refresh_interval"),
    (dict(fragment=dict(refresh_interval=0)), "fragment.refresh_interval"),
    (dict(fragment=dict(flush_interval=59)), "fragment.flush_interval"),
    (dict(fragment=dict(stores=("s3://bucket/", "gs://x/"))), "fragment.stores[1]"),
    (dict(fragment=dict(stores=("s3://bucket/a", ))), "fragment.stores[0]"),
    (dict(fragment=dict(stores=("file:///tmp/x/",), compression_codec=Codec.GZIP_OFFLOAD_DECOMPRESSION)),
     "fragment.compression_codec"),
    (dict(fragment=dict(path_postfix_template="{nope}")), "fragment.path_postfix_template"),
    (dict(fragment=dict(path_postfix_template="{utc.nope}")), "fragment.path_postfix_template"),
    (dict(fragment=dict(path_postfix_template="{")), "fragment.path_postfix_template"),
    (dict(fragment=dict(path_postfix_template="../{utc:%Y}")), "fragment.path_postfix_template"),
    (dict(fragment=dict(path_postfix_template="/abs")), "fragment.path_postfix_template"),
    (dict(fragment=dict(path_postfix_template=".quire")), "fragment.path_postfix_template"),
    (dict(max_append_rate=-1), "max_append_rate"),
    (dict(suspend=Suspend(offset=-1)), "suspend.offset"),
])
def test_spec_bounds_name_the_field(kw: dict, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(**kw).validate()
    assert info.value.path == path, info.value
    with pytest.raises(ValidationError) as info:
        spec(**kw).validate("journals[3]")
    assert info.value.path == f"journals[3].{path}"


@pytest.mark.parametrize("kw", [
    dict(replication=1), dict(replication=5), dict(fragment=dict(length=1024)),
    dict(fragment=dict(length=1 << 34)), dict(fragment=dict(refresh_interval=1)),
    dict(fragment=dict(refresh_interval=86400)), dict(fragment=dict(flush_interval=0)),
    dict(fragment=dict(flush_interval=60)), dict(fragment=dict(stores=())),
    dict(fragment=dict(compression_codec=Codec.GZIP_OFFLOAD_DECOMPRESSION)),
    dict(fragment=dict(path_postfix_template="date={utc:%Y-%m-%d}/hour={utc:%H}")),
])
def test_spec_bounds_inclusive(kw: dict) -> None:
    spec(**kw).validate()


def test_spec_json_round_trip() -> None:
    s = spec(labels=LabelSet.of({"topic": "x"}), replication=2)
    assert msgspec.json.decode(msgspec.json.encode(s), type=JournalSpec) == s


@pytest.mark.parametrize("url", [
    "file:///", "file:///var/quire/", "s3://bucket/", "s3://my.bucket-1/a/b/", "s3://abc/p=1/",
])
def test_valid_store_urls(url: str) -> None:
    validate_store_url(url)


@pytest.mark.parametrize("url", [
    "file:///no/slash", "file://host/dir/", "file:///a/../b/", "s3://bucket", "s3://Bucket/",
    "s3://b/", "s3://bucket//", "s3://bucket/a//b/", "s3://bucket/../", "gs://bucket/",
    "bucket/", "", "s3:/bucket/", "http://x/",
])
def test_invalid_store_urls(url: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_store_url(url, "fragment.stores[0]")
    assert info.value.path == "fragment.stores[0]"


def test_fragment_validation() -> None:
    sha = "a" * 40
    Fragment(journal="a/b/c", begin=0, end=10, sum=sha).validate()
    Fragment(journal="a/b/c", begin=5, end=5).validate()
    for bad, path in [
        (Fragment(journal="a/b/c", begin=5, end=4, sum=sha), "fragment.end"),
        (Fragment(journal="a/b/c", begin=-1, end=4, sum=sha), "fragment.end"),
        (Fragment(journal="a/b/c", end=4, sum="A" * 40), "fragment.sum"),
        (Fragment(journal="a/b/c", end=4, sum="a" * 39), "fragment.sum"),
        (Fragment(journal="a/b/c", begin=4, end=4, sum=sha), "fragment.sum"),
        (Fragment(journal="bad name", end=4, sum=sha), "fragment.journal"),
        (Fragment(journal="a/b/c", end=4, sum=sha, path_postfix="../x"), "fragment.path_postfix"),
    ]:
        with pytest.raises(ValidationError) as info:
            bad.validate()
        assert info.value.path == path


def test_parse_duration() -> None:
    assert parse_duration("10m") == 600 and parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == 0.25 and parse_duration(90) == 90.0 and parse_duration("1.5") == 1.5
    assert parse_duration("1d") == 86400
    for bad in ("", "10x", "m10", "1h 30m", True, None):
        with pytest.raises(ValidationError):
            parse_duration(bad)  # type: ignore[arg-type]


# -- errors -----------------------------------------------------------------------------

def test_validation_error_within_and_pickle() -> None:
    err = ValidationError("stores[1]", "bad")
    assert str(err.within("fragment")) == "fragment.stores[1]: bad"
    assert err.within("journals").path == "journals.stores[1]"
    assert ValidationError("[2]", "x").within("stores").path == "stores[2]"
    assert ValidationError("", "x").within("a").path == "a"
    assert str(ValidationError("", "only reason")) == "only reason"
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.path, back.reason, str(back)) == (ValidationError, "stores[1]", "bad", str(err))
    assert isinstance(err, ValueError)


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_for_status_maps_every_status(status: Status) -> None:
    cls = for_status(status)
    assert issubclass(cls, StatusError) and cls.status is status
    assert for_status(int(status)) is cls
    assert cls.__name__ == "".join(p.capitalize() for p in status.name.split("_"))
    err = cls("details", journal="a/b")
    assert err.status is status and err.journal == "a/b"
    assert str(err) == f"{status.name} (journal a/b): details"
    assert err.retriable == status.retriable
    with pytest.raises(cls):
        raise_for_status(status, "x", journal="a/b")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err) and back.journal == "a/b"
    import protocol.errors as errors_mod
    assert getattr(errors_mod, cls.__name__) is cls


def test_ok_status_does_not_raise() -> None:
    raise_for_status(Status.OK)
    with pytest.raises((KeyError, ValueError)):
        for_status(Status.OK)
    assert Status.WRONG_ROUTE.retriable and not Status.REGISTER_MISMATCH.retriable
    assert [s.value for s in Status][:16] == list(range(16))  # Gazette's numbers
