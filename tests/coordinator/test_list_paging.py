"""List pages (#49): one ListResponse is one frame of at most 1 MiB of header, which
~1,800 journals' entries already exceed; a paged List answers at most `page_limit`
entries and about half a frame, with the name to continue after."""

from __future__ import annotations

import msgspec

from coordinator.specs import PAGE_BYTES, list_page
from protocol import FragmentSpec, JournalSpec, LabelSet, ProcessId, Route
from protocol.messages import ListEntry, ListResponse
from protocol.wire import MAX_HEADER, encode_frame

MEMBERS = tuple(ProcessId(f"zone-{z}", f"coordinator-{i}") for i, z in enumerate("abc"))


def entries(n: int) -> list[ListEntry]:
    route = Route(members=MEMBERS, primary=0,
                  endpoints=("127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"))
    return [ListEntry(spec=JournalSpec(name=f"scale/j-{i:05d}", replication=3,
                                       labels=LabelSet.of(topic="scale"),
                                       fragment=FragmentSpec(stores=("file:///tmp/fragments/",))),
                      mod_revision=100_000 + i, create_revision=100_000 + i, route=route)
            for i in range(n)]


def test_ten_thousand_entries_page_within_a_frame_and_all_come_back() -> None:
    everything = entries(10_000)
    assert len(msgspec.msgpack.encode(ListResponse(journals=tuple(everything)))) > MAX_HEADER
    seen: list[ListEntry] = []
    token, pages = "", 0
    while True:
        rest = [e for e in everything if e.spec.name > token]
        page, token = list_page(rest, 1000)
        pages += 1
        assert 0 < len(page) <= 1000
        header = len(msgspec.msgpack.encode(ListResponse(journals=tuple(page))))
        assert header <= PAGE_BYTES + 1024 < MAX_HEADER
        encode_frame(ListResponse(journals=tuple(page)))  # within the wire's limits
        seen += page
        if not token:
            break
        assert token == page[-1].spec.name
    assert seen == everything and pages >= 10


def test_unpaged_is_every_entry() -> None:
    everything = entries(50)
    assert list_page(everything, 0) == (everything, "")
    assert list_page(everything, 50) == (everything, "")
    assert list_page(everything, 20) == (everything[:20], everything[19].spec.name)
