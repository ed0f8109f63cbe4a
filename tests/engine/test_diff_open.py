"""A diff to the open generation: its pending changes before the commit (``diff --to @open``), as a read
there sees them; a cursor of it expires when the generation is aborted."""

from __future__ import annotations

import pytest

from diffstore import Store
from diffstore.errors import CursorExpired, NoSuchGeneration

from .util import commit, raw_state


def _pending(store: Store):
    c = store.create_collection("c", manual=True)
    commit(c, b"1", [(b"a", b"1"), (b"b", b"1")])
    c.start_generation(b"2")
    c.put_many([(b"a", b"2"), (b"b", None), (b"c", b"3")], generation_id=b"2")
    return c


def test_a_diff_to_the_open_generation_shows_its_pending_changes(store: Store) -> None:
    c = _pending(store)
    assert [(i.key, i.from_value, i.to_value) for i in c.diff(b"1", b"2")] == [
        (b"a", b"1", b"2"),
        (b"b", b"1", None),
        (b"c", None, b"3"),
    ]
    assert [(i.key, i.from_value, i.to_value) for i in c.diff(b"", b"2")] == [
        (b"a", None, b"2"),
        (b"c", None, b"3"),
    ]
    page = c.diff_page(b"1", b"2")
    assert page.to_generation_id == b"2" and page.cursor is None
    c.commit_generation(b"2")  # the same changes once committed
    assert [(i.key, i.to_value) for i in c.diff(b"1", b"2")] == [(b"a", b"2"), (b"b", None), (b"c", b"3")]


def test_an_automatic_collections_open_generation_too(store: Store) -> None:
    c = store.create_collection("auto", manual=False)
    c.put(b"k", b"v")
    assert c.next_generation_id is not None
    assert [(i.key, i.to_value) for i in c.diff(b"", c.next_generation_id)] == [(b"k", b"v")]


def test_a_cursor_of_an_aborted_open_generation_expires(store: Store) -> None:
    c = _pending(store)
    page = c.diff_page(b"1", b"2", limit=1)
    assert [i.key for i in page.items] == [b"a"] and page.cursor is not None
    assert [i.key for i in c.diff_page(cursor=page.cursor).items] == [b"b"]
    c.abort_generation(b"2")
    before = raw_state(store)
    with pytest.raises(CursorExpired) as info:
        c.diff_page(cursor=page.cursor)
    assert info.value.code == "cursorExpired"
    assert raw_state(store) == before


def test_above_the_current_generation_and_not_open_is_still_unknown(store: Store) -> None:
    c = _pending(store)
    with pytest.raises(NoSuchGeneration):
        list(c.diff(b"1", b"3"))
