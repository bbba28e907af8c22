from __future__ import annotations

import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    ALL_MESSAGES,
    Codec,
    FrameTooLarge,
    Fragment,
    FragmentSpec,
    JournalSpec,
    LabelSet,
    ProcessId,
    ProtocolError,
    Route,
    Status,
    parse_selector,
)
from protocol import messages as m
from protocol.route import Etcd, Header
from protocol.wire import (
    MAX_CHUNK,
    MAX_FRAME,
    MAX_HEADER,
    PREFIX,
    PREFIX_SIZE,
    FrameDecoder,
    check_prefix,
    decode_header,
    encode_frame,
    encode_frame_bytes,
)

SHA = "0123456789abcdef0123456789abcdef01234567"
FRAG = Fragment(journal="a/journal", begin=10, end=20, sum=SHA, codec=Codec.ZSTANDARD,
                backing_store="s3://b/", mod_time=5, path_postfix="d=1")
HEADER = Header(process_id=ProcessId("z1", "broker-1"),
                route=Route(members=(ProcessId("z1", "broker-1"), ProcessId("z2", "broker-2")),
                            primary=1, endpoints=("127.0.0.1:1", "127.0.0.1:2")),
                etcd=Etcd(cluster_id=1, member_id=2, revision=3, raft_term=4))
REGS = LabelSet.of({"owner": "me", "epoch": "3"})
SPEC = JournalSpec(name="a/journal", labels=LabelSet.of({"topic": "x"}),
                   fragment=FragmentSpec(stores=("s3://bucket/p/",)))

SAMPLES: list[tuple[m.Message, bytes]] = [
    (m.Hello(token="t"), b""),
    (m.HelloAck(process_id=ProcessId("z", "suffix")), b""),
    (m.Hello(token="t", mux=True), b""),
    (m.ChannelClose(reason="done"), b""),
    (m.ErrorFrame(status=Status.WRONG_ROUTE, message="nope"), b""),
    (m.AppendRequest(journal="a/journal", header=HEADER, do_not_proxy=True, offset=7,
                     check_registers=parse_selector("owner=me, !lock"), union_registers=REGS,
                     subtract_registers=LabelSet.of({"epoch": ""}), suspend="no-resume",
                     min_etcd_revision=9), b""),
    (m.AppendChunk(), b"content bytes"),
    (m.AppendCommit(), b""),
    (m.AppendAbort(reason="client gone"), b""),
    (m.AppendResponse(status=Status.REGISTER_MISMATCH, header=HEADER, commit=FRAG, registers=REGS,
                      total_chunks=3, delayed_chunks=1, message="m"), b""),
    (m.ReadRequest(journal="a/journal", header=HEADER, offset=-1, block=True, do_not_proxy=True,
                   metadata_only=True, end_offset=99, begin_mod_time=4, min_etcd_revision=2), b""),
    (m.ReadResponse(status=Status.OK, header=HEADER, offset=10, write_head=20, fragment=FRAG,
                    fragment_url="http://x/y", message=""), b""),
    (m.ReadContent(offset=12), b"\x00\x01\x02" * 100),
    (m.ReplicateProposal(proposal=FRAG, registers=REGS, acknowledge=False, header=HEADER), b""),
    (m.ReplicateContent(content_delta=5), b"x" * MAX_CHUNK),
    (m.ReplicateResponse(status=Status.PROPOSAL_MISMATCH, header=HEADER, fragment=FRAG,
                         registers=REGS, message="m"), b""),
    (m.ListRequest(selector=parse_selector("topic in (a, b), !xx")), b""),
    (m.ListResponse(header=HEADER, journals=(m.ListEntry(spec=SPEC, mod_revision=3, create_revision=2,
                                                          route=HEADER.route),)), b""),
    (m.ApplyRequest(changes=(m.ApplyChange(expect_mod_revision=-1, upsert=SPEC),
                             m.ApplyChange(expect_mod_revision=4, delete="a/other"))), b""),
    (m.ApplyResponse(header=HEADER, revision=12), b""),
    (m.ListFragmentsRequest(journal="a/journal", begin_mod_time=1, end_mod_time=2, next_page_token=3,
                            page_limit=10, signature_ttl=5.5, do_not_proxy=True), b""),
    (m.ListFragmentsResponse(header=HEADER, fragments=(m.FragmentInfo(spec=FRAG, signed_url="u",
                                                                      local=True),),
                             next_page_token=20), b""),
    (m.ListBrokersRequest(), b""),
    (m.ListBrokersResponse(brokers=(m.BrokerInfo(id=ProcessId("z", "suffix"), endpoint="h:1",
                                                 journal_limit=5, assigned=2, primaries=1,
                                                 exiting=True),)), b""),
    (m.FetchFragmentRequest(fragment=FRAG), b""),
    (m.FetchFragmentResponse(status=Status.JOURNAL_NOT_FOUND, message="gone"), b""),
    (m.FragmentContent(), b"raw"),
    (m.FragmentContent(), b""),
]


def test_every_message_kind_is_sampled_and_unique() -> None:
    kinds = [cls.KIND for cls in ALL_MESSAGES]
    assert len(kinds) == len(set(kinds)) and 0 not in kinds and all(0 < k < 256 for k in kinds)
    assert {type(msg) for msg, _ in SAMPLES} == set(ALL_MESSAGES)


@pytest.mark.parametrize("msg,payload", SAMPLES, ids=lambda x: type(x).__name__ if isinstance(x, m.Message) else "")
def test_round_trip(msg: m.Message, payload: bytes) -> None:
    data = encode_frame_bytes(msg, payload)
    length, kind, hlen = PREFIX.unpack(data[:PREFIX_SIZE])
    assert length == len(data) - 4 and kind == msg.KIND
    dec = FrameDecoder()
    dec.feed(data)
    [frame] = list(dec.frames())
    assert frame.message == msg and bytes(frame.payload) == payload
    assert dec.buffered == 0
    # The defaults round-trip too (omit_defaults keeps headers small).
    assert decode_header(kind, data[PREFIX_SIZE:PREFIX_SIZE + hlen]) == msg


def test_stream_of_all_messages_split_at_every_boundary() -> None:
    small = [(msg, p[:50]) for msg, p in SAMPLES]
    data = b"".join(encode_frame_bytes(msg, p) for msg, p in small)
    for cut in range(0, len(data) + 1, 7):
        dec = FrameDecoder()
        got = []
        for piece in (data[:cut], data[cut:]):
            dec.feed(piece)
            got.extend((f.message, bytes(f.payload)) for f in dec.frames())
        assert got == small
    # Byte at a time.
    dec = FrameDecoder()
    got = []
    for i in range(len(data)):
        dec.feed(data[i:i + 1])
        got.extend((f.message, bytes(f.payload)) for f in dec.frames())
    assert got == small and dec.buffered == 0


def test_encode_limits() -> None:
    with pytest.raises(ProtocolError):
        encode_frame(m.AppendChunk(), b"x" * (MAX_CHUNK + 1))
    with pytest.raises(ProtocolError):
        encode_frame(m.AppendAbort(reason="r" * (MAX_HEADER + 1)))
    bufs = encode_frame(m.AppendChunk(), memoryview(b"payload"))
    assert len(bufs) == 2 and bytes(bufs[1]) == b"payload"


def prefix(length: int, kind: int, hlen: int) -> bytes:
    return struct.pack("!IBI", length, kind, hlen)


@pytest.mark.parametrize("length,exc", [
    (0, ProtocolError), (4, ProtocolError), (MAX_FRAME + 1, FrameTooLarge), (1 << 31, FrameTooLarge),
    ((1 << 32) - 1, FrameTooLarge),
])
def test_hostile_lengths(length: int, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        check_prefix(prefix(length, m.AppendChunk.KIND, 0))
    dec = FrameDecoder()
    with pytest.raises(exc):  # rejected as soon as the prefix is in, before any body
        dec.feed(prefix(length, m.AppendChunk.KIND, 0))
        list(dec.frames())


def test_prefix_checks() -> None:
    assert check_prefix(prefix(5, m.AppendCommit.KIND, 0)) == (m.AppendCommit.KIND, 0, 0)
    assert check_prefix(prefix(MAX_FRAME, m.AppendChunk.KIND, MAX_HEADER)) == (m.AppendChunk.KIND, MAX_HEADER, MAX_CHUNK)
    with pytest.raises(ProtocolError):
        check_prefix(prefix(10, 0, 0))            # unknown kind
    with pytest.raises(ProtocolError):
        check_prefix(prefix(10, 255, 0))
    with pytest.raises(ProtocolError):
        check_prefix(prefix(10, m.AppendChunk.KIND, 6))   # header longer than the frame
    with pytest.raises(ProtocolError):
        check_prefix(prefix(MAX_FRAME, m.AppendChunk.KIND, MAX_HEADER + 1))
    with pytest.raises(FrameTooLarge):
        check_prefix(prefix(MAX_FRAME, m.AppendChunk.KIND, 0))  # payload over the chunk limit
    for short in (b"", b"\x00" * 8, b"\x00" * 10):
        with pytest.raises(ProtocolError):
            check_prefix(short)


def test_bad_headers_are_protocol_errors() -> None:
    for kind, header in [
        (m.AppendRequest.KIND, msgspec.msgpack.encode({})),              # journal missing
        (m.AppendRequest.KIND, msgspec.msgpack.encode({"journal": 5})),
        (m.ErrorFrame.KIND, msgspec.msgpack.encode({"status": 9999})),
        (m.Hello.KIND, b"\xc1"),                                          # never-used msgpack byte
        (m.Hello.KIND, b"\x92\x01"),                                      # truncated array
        (m.ReadResponse.KIND, msgspec.msgpack.encode({"fragment": {"journal": "a", "codec": "lz4"}})),
    ]:
        data = prefix(5 + len(header), kind, len(header)) + header
        dec = FrameDecoder()
        dec.feed(data)
        with pytest.raises(ProtocolError):
            list(dec.frames())


def test_trailing_junk_after_valid_frames() -> None:
    data = encode_frame_bytes(m.Hello()) + b"\xff" * 9
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(data)
        list(dec.frames())
    # Junk shorter than a prefix just waits (the connection's EOF handling reports it).
    dec = FrameDecoder()
    dec.feed(encode_frame_bytes(m.Hello()) + b"\x00\x00")
    assert [type(f.message) for f in dec.frames()] == [m.Hello]
    assert dec.buffered == 2


# -- fuzz -------------------------------------------------------------------------------

valid_frames = st.sampled_from([encode_frame_bytes(msg, p[:64]) for msg, p in SAMPLES])
noise = st.binary(max_size=64)
kinds = st.sampled_from([0, 1, 2, 3, 4, 9, 10, 11, 14, 30, 50, 51, 127, 255])
hostile_prefixes = st.builds(
    prefix,
    st.sampled_from([0, 1, 4, 5, 6, 100, MAX_FRAME, MAX_FRAME + 1, 1 << 31, (1 << 32) - 1]),
    kinds,
    st.sampled_from([0, 1, 4, 100, MAX_HEADER, MAX_HEADER + 1, (1 << 32) - 1]),
)
streams = st.lists(st.one_of(valid_frames, noise, hostile_prefixes,
                             valid_frames.map(lambda f: f[:-1])), max_size=8).map(b"".join)


def drive(data: bytes, cuts: list[int]) -> int:
    """Feed `data` split at `cuts`; decode after every feed. Returns frames decoded."""
    dec = FrameDecoder()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    n = 0
    for a, b in zip(points, points[1:]):
        dec.feed(data[a:b])
        for frame in dec.frames():
            n += 1
            assert isinstance(frame.message, m.Message)
        # Never more than one (bounded) frame is held back.
        assert dec.buffered <= PREFIX_SIZE + MAX_FRAME + (b - a)
    return n


@given(streams, st.lists(st.integers(0, 10_000), max_size=12))
@settings(max_examples=1500, deadline=None)
def test_fuzz_decoder_raises_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    try:
        drive(data, cuts)
    except ProtocolError:
        pass


@given(st.binary(max_size=200), st.lists(st.integers(0, 300), max_size=6))
@settings(max_examples=1500, deadline=None)
def test_fuzz_random_bytes(data: bytes, cuts: list[int]) -> None:
    try:
        drive(data, cuts)
    except ProtocolError:
        pass


@given(st.binary(max_size=12))
@settings(max_examples=1000, deadline=None)
def test_fuzz_check_prefix(data: bytes) -> None:
    try:
        kind, hlen, plen = check_prefix(data)
    except ProtocolError:
        return
    assert len(data) == PREFIX_SIZE and hlen <= MAX_HEADER and plen <= MAX_CHUNK


@given(valid_frames, st.integers(0, 10_000), st.binary(min_size=1, max_size=40))
@settings(max_examples=500, deadline=None)
def test_fuzz_corrupted_valid_frame(frame: bytes, where: int, garbage: bytes) -> None:
    i = where % len(frame)
    data = frame[:i] + garbage + frame[i + len(garbage):]
    try:
        drive(data, [i, i + 1])
    except ProtocolError:
        pass


@given(kinds, st.binary(max_size=60))
@settings(max_examples=1000, deadline=None)
def test_fuzz_random_headers_for_every_kind(kind: int, header: bytes) -> None:
    data = prefix(5 + len(header), kind, len(header)) + header
    try:
        drive(data, [])
    except ProtocolError:
        pass


@given(st.sampled_from(list(ALL_MESSAGES)), st.binary(max_size=80))
@settings(max_examples=1000, deadline=None)
def test_fuzz_header_decoding(cls: type[m.Message], header: bytes) -> None:
    try:
        decode_header(cls.KIND, header)
    except ProtocolError:
        pass


# -- the asyncio adapter ----------------------------------------------------------------

async def test_frame_stream_rejects_hostile_prefix_without_reading_body() -> None:
    import asyncio

    from protocol.stream import ConnectionClosed

    _, stream = _stream_over(prefix((1 << 32) - 1, m.AppendChunk.KIND, 0))  # no body will come
    with pytest.raises(FrameTooLarge):
        await asyncio.wait_for(stream.read(), 5)

    protocol, stream = _stream_over(encode_frame_bytes(m.ReadContent(offset=3), b"abc"),
                                    encode_frame_bytes(m.Hello())[:-1])
    protocol.eof_received()
    frame = await asyncio.wait_for(stream.read(), 5)
    assert frame.message == m.ReadContent(offset=3) and bytes(frame.payload) == b"abc"
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(stream.read(), 5)


def _stream_over(*parts: bytes):  # noqa: ANN202
    from protocol.frame_protocol import FrameProtocol
    from protocol.stream import FrameStream

    protocol = FrameProtocol()
    for part in parts:
        protocol.feed(part)
    return protocol, FrameStream(protocol)


async def test_frame_stream_read_waits_once_per_frame_and_maps_a_reset() -> None:
    """read() waits for the whole frame (bytes trickling in), and a transport error
    while it waits is ConnectionClosed."""
    import asyncio

    from protocol.stream import ConnectionClosed

    whole = encode_frame_bytes(m.ReadContent(offset=3), b"abc")
    reader, stream = _stream_over(whole[:4])
    loop = asyncio.get_running_loop()
    for i in range(4, len(whole)):
        loop.call_later(0.001 * i, reader.feed, whole[i:i + 1])
    frame = await asyncio.wait_for(stream.read(), 5)
    assert frame.message == m.ReadContent(offset=3) and bytes(frame.payload) == b"abc"
    reader, stream = _stream_over(whole[:5])
    loop.call_later(0.01, reader.connection_lost, ConnectionResetError("reset by peer"))
    with pytest.raises(ConnectionClosed, match="reset by peer"):
        await asyncio.wait_for(stream.read(), 5)


async def test_take_run_takes_a_whole_append_or_nothing() -> None:
    chunk = (m.AppendChunk.KIND, encode_frame_bytes(m.AppendChunk())[9:])
    commit = (m.AppendCommit.KIND, encode_frame_bytes(m.AppendCommit())[9:])
    run = (encode_frame_bytes(m.AppendChunk(), b"ab") + encode_frame_bytes(m.AppendChunk(), b"c")
           + encode_frame_bytes(m.AppendCommit()))
    after = encode_frame_bytes(m.Hello())
    reader, stream = _stream_over(run + after)
    assert stream.take_run(chunk, commit) == [b"ab", b"c"]
    assert reader.unconsumed() == after  # the next frame stays
    for partial in (run[:-1], run[:20], encode_frame_bytes(m.AppendCommit()),
                    encode_frame_bytes(m.AppendChunk(), b"") + run,
                    encode_frame_bytes(m.AppendChunk(), b"ab") + encode_frame_bytes(
                        m.AppendAbort(reason="x")),
                    prefix((1 << 32) - 1, m.AppendChunk.KIND, 0)):
        reader, stream = _stream_over(partial)
        assert stream.take_run(chunk, commit) is None
        assert reader.unconsumed() == partial  # nothing consumed


async def test_take_copies_counts_leading_copies_only() -> None:
    ok = encode_frame_bytes(m.ReplicateResponse())
    other = encode_frame_bytes(m.ReplicateResponse(status=Status.PROPOSAL_MISMATCH))
    reader, stream = _stream_over(ok * 3 + other + ok)
    assert stream.take_copies(ok) == 3
    assert reader.unconsumed() == other + ok
    assert stream.take_copies(ok) == 0
    reader, stream = _stream_over(ok * 2 + ok[:-1])
    assert stream.take_copies(ok) == 2 and reader.unconsumed() == ok[:-1]
