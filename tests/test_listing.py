"""`Authority.list_page`: a scope walked a page at a time, on any store.

The walk lists what `list` lists, in its order, whatever the page size; a
store that cannot read a page (no `list_page`) is listed whole and cut, with
the same answers; a cursor keeps its place when the workload it ended on is
purged; and a cursor that no page gave is refused, naming `after`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import authority as make_authority
from support import request
from workwarden.statemachine import Authority, WorkloadError
from workwarden.storage import ForwardingStore, MemoryStore, SQLiteStore
from workwarden.storage.base import ListPages


def admitted(authority: Authority, priorities: list[int]) -> list[str]:
    return [
        authority.admit(
            request(idempotency_key=f"k{n}", priority=p), now=10_000 + n % 3
        ).workload.workload_id
        for n, p in enumerate(priorities)
    ]


def walk(authority: Authority, limit: int) -> list[str]:
    ids: list[str] = []
    after = None
    while True:
        page = authority.list_page("t", "app", limit, after)
        assert len(page.workloads) <= limit
        ids.extend(w.workload_id for w in page.workloads)
        if page.next is None:
            assert len(page.workloads) < limit
            return ids
        assert len(page.workloads) == limit
        after = page.next


@given(
    priorities=st.lists(st.integers(-3, 3), max_size=30),
    limit=st.integers(1, 12),
)
def test_a_walk_by_pages_lists_what_list_lists_on_any_store(
    priorities: list[int], limit: int
) -> None:
    paged = make_authority(MemoryStore())
    whole = make_authority(ForwardingStore(MemoryStore()))  # no list_page: listed whole, cut
    assert isinstance(paged.store, ListPages)
    assert not isinstance(whole.store, ListPages)
    for authority in (paged, whole):
        admitted(authority, priorities)
        assert walk(authority, limit) == [w.workload_id for w in authority.list("t", "app")]


def test_a_cursor_keeps_its_place_when_its_workload_is_purged(tmp_path: Path) -> None:
    authority = make_authority(SQLiteStore(tmp_path / "store.db"))
    admitted(authority, [0] * 6)
    ids = [w.workload_id for w in authority.list("t", "app")]
    first = authority.list_page("t", "app", 2)
    assert [w.workload_id for w in first.workloads] == ids[:2]
    authority.cancel(ids[1], "ops", 11_000)  # queued work: cancelled at once, then purged
    report = authority.purge(12_000, older_than_ms=0)
    assert authority.store.read(ids[1]) is None, report
    second = authority.list_page("t", "app", 2, first.next)
    assert [w.workload_id for w in second.workloads] == ids[2:4]
    authority.store.close()


def cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "after",
    [
        "",
        "garbage!",
        "x" * 5_000,
        cursor({"priority": 0}),
        cursor([0, 0]),
        cursor([True, 0, "k"]),
        cursor([0.5, 0, "k"]),
        cursor([0, 0, 7]),
        cursor([0, 0, "k"]) + "==",
        cursor([2**63, 0, "k"]),
        cursor([0, -(2**64), "k"]),
        cursor([0, 0, ""]),
        cursor([0, 0, "a\x00b"]),
        cursor([0, 0, "k" * 257]),
        7,
        b"abc",
    ],
)
def test_a_cursor_no_page_gave_is_refused_naming_after(after: object) -> None:
    authority = make_authority(MemoryStore())
    admitted(authority, [0, 1])
    with pytest.raises(WorkloadError) as refused:
        authority.list_page("t", "app", 5, after)  # type: ignore[arg-type]
    assert refused.value.code == "WORKLOAD_INVALID"
    assert "after" in str(refused.value)
