"""Cursor tokens: authenticated, every field checked, stable across restarts and processes, never a page
that changed (an aborted open generation answers ``cursorExpired``)."""

from __future__ import annotations

import base64
import multiprocessing
from pathlib import Path

import msgpack
import pytest

from diffstore import Store
from diffstore.engine.cursors import SECRET_FILE, CursorCodec, CursorSecret, DiffCursor, QueryCursor
from diffstore.engine.types import DiffSpec, FromReader
from diffstore.errors import CursorExpired, NoSuchCursor

from .conftest import StoreFactory
from .util import raw_state


def _filled(store: Store, name: str = "c", count: int = 10) -> None:
    coll = store.create_collection(name, manual=True)
    coll.start_generation(b"1")
    coll.put_many([(b"k%02d" % i, b"v%d" % i) for i in range(count)], generation_id=b"1")
    coll.commit_generation(b"1")


def _token_parts(token: str) -> tuple[bytes, list[object]]:
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return raw[:16], msgpack.unpackb(raw[16:], raw=False)


def _sign(codec: CursorCodec, fields: list[object]) -> str:
    """A token over any body, signed with ``codec``'s key (what only a server holding the key can make)."""
    body = msgpack.packb(fields, use_bin_type=True)
    return base64.urlsafe_b64encode(codec._mac(body) + body).rstrip(b"=").decode()


def test_a_token_resumes_the_same_page_twice(store: Store) -> None:
    _filled(store)
    coll = store.collection("c")
    first = coll.query_page(limit=3)
    assert first.cursor is not None
    again = [coll.query_page(cursor=first.cursor) for _ in range(2)]
    assert again[0] == again[1]
    assert [r.key for r in again[0].items] == [b"k03", b"k04", b"k05"]


def test_every_edited_byte_is_no_such_cursor(store: Store) -> None:
    _filled(store)
    coll = store.collection("c")
    token = coll.query_page(limit=3).cursor
    assert token is not None
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    before = raw_state(store)
    tried = 0
    for i in range(len(raw)):
        for flip in (0x01, 0x80):
            edited = bytearray(raw)
            edited[i] ^= flip
            forged = base64.urlsafe_b64encode(bytes(edited)).rstrip(b"=").decode()
            with pytest.raises(NoSuchCursor):
                coll.query_page(cursor=forged)
            tried += 1
    for cut in range(len(token)):
        with pytest.raises(NoSuchCursor):
            coll.query_page(cursor=token[:cut])
    assert tried == 2 * len(raw)
    assert raw_state(store) == before


def test_a_token_re_signed_with_another_key_is_refused(store: Store, tmp_path: Path) -> None:
    _filled(store)
    coll = store.collection("c")
    token = coll.query_page(limit=3).cursor
    assert token is not None
    _, fields = _token_parts(token)
    other = CursorCodec(CursorSecret(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    for limit in (3, 10**9, -1):
        forged = fields.copy()
        forged[8] = limit  # [version, kind, cid, gen, seq, phantom, from, to, limit, after]
        with pytest.raises(NoSuchCursor):
            coll.query_page(cursor=_sign(other, forged))


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (8, 10**9),  # limit above the store's maximum
        (8, 0),
        (8, -1),
        (8, "3"),
        (8, True),
        (2, "cid"),  # cid
        (3, None),  # generation id
        (3, b"x" * 256),
        (4, -2),  # seq
        (4, 1.5),
        (5, b""),  # phantom id
        (6, 7),  # from key
        (7, [b"a"]),  # to key
        (9, None),  # after key
        (0, 1),  # an older format
        (1, "d"),  # another kind
    ],
)
def test_every_field_is_checked_even_behind_a_good_mac(store: Store, index: int, value: object) -> None:
    """A token signed with the store's own key but holding a wrong field is refused, not a TypeError."""
    _filled(store)
    coll = store.collection("c")
    token = coll.query_page(limit=3).cursor
    assert token is not None
    _, fields = _token_parts(token)
    fields[index] = value
    with pytest.raises(NoSuchCursor):
        coll.query_page(cursor=_sign(store.cursors, fields))
    with pytest.raises(NoSuchCursor):
        coll.query_page(cursor=_sign(store.cursors, [*_token_parts(token)[1], b"extra"]))


def test_a_query_token_is_not_a_diff_token(store: Store) -> None:
    _filled(store)
    coll = store.collection("c")
    query_token = coll.query_page(limit=3).cursor
    diff_token = coll.diff_page(from_generation_id=b"", limit=3).cursor
    assert query_token is not None and diff_token is not None
    with pytest.raises(NoSuchCursor):
        coll.diff_page(cursor=query_token)
    with pytest.raises(NoSuchCursor):
        coll.query_page(cursor=diff_token)
    _, fields = _token_parts(diff_token)
    fields[9] = 1  # include_intermediate must be a bool
    with pytest.raises(NoSuchCursor):
        coll.diff_page(cursor=_sign(store.cursors, fields))


def test_dataclasses_validate_on_construction() -> None:
    QueryCursor(1, b"g", 0, None, None, None, 10, b"k")
    DiffCursor(1, 0, 1, DiffSpec(from_generation_id=b"a", to_generation_id=b"b", limit=10), b"k")
    with pytest.raises(ValueError):
        DiffCursor(
            1, 0, 1, DiffSpec(from_generation_id=b"b", to_generation_id=b"a", limit=10), b"k"
        )  # from above to
    with pytest.raises(ValueError):
        DiffCursor(
            1, 5, 1, DiffSpec(from_generation_id=b"a", to_generation_id=b"b", limit=10), b"k"
        )  # to below from
    with pytest.raises(ValueError):  # a resumed range is resolved: it names no reader
        DiffCursor(
            1,
            0,
            1,
            DiffSpec(from_generation_id=b"a", from_reader=FromReader("r"), to_generation_id=b"b", limit=10),
            b"k",
        )
    with pytest.raises(ValueError):  # a page size is part of a cursor
        DiffCursor(1, 0, 1, DiffSpec(from_generation_id=b"a", to_generation_id=b"b", limit=None), b"k")


def test_tokens_survive_a_restart(open_store: StoreFactory, tmp_path: Path) -> None:
    store = open_store()
    _filled(store)
    token = store.collection("c").query_page(limit=3).cursor
    assert token is not None
    expected = store.collection("c").query_page(cursor=token)
    store.close()
    assert (tmp_path / "store" / SECRET_FILE).stat().st_mode & 0o077 == 0  # readable by the owner only
    reopened = open_store()
    assert reopened.collection("c").query_page(cursor=token) == expected


def _make_secret(directory: str) -> bytes:
    return CursorSecret(directory).key()


def test_the_secret_is_made_once_whichever_process_comes_first(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        keys = pool.map(_make_secret, [str(tmp_path)] * 8)
    assert len(set(keys)) == 1
    assert CursorSecret(tmp_path).key() == keys[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [SECRET_FILE]  # no staging file left behind


def test_a_cursor_over_an_aborted_open_generation_expires(store: Store) -> None:
    _filled(store)
    coll = store.collection("c")
    coll.start_generation(b"2")
    coll.put_many([(b"n%02d" % i, b"new") for i in range(10)], generation_id=b"2")
    token = coll.query_page(generation_id=b"2", limit=5).cursor
    assert token is not None
    page = coll.query_page(cursor=token)
    coll.abort_generation(b"2")
    with pytest.raises(CursorExpired):
        coll.query_page(cursor=token)
    coll.start_generation(b"2")  # the same id again is another generation: the old cursor stays expired
    coll.put_many([(b"z", b"other")], generation_id=b"2")
    with pytest.raises(CursorExpired):
        coll.query_page(cursor=token)
    assert [r.key for r in page.items][:1] == [b"k05"]


def test_a_cursor_over_an_open_generation_that_commits_keeps_its_page(store: Store) -> None:
    _filled(store)
    coll = store.collection("c")
    coll.start_generation(b"2")
    coll.put_many([(b"n%02d" % i, b"new") for i in range(10)], generation_id=b"2")
    token = coll.query_page(generation_id=b"2", limit=5).cursor
    assert token is not None
    page = coll.query_page(cursor=token)
    coll.commit_generation(b"2")
    assert coll.query_page(cursor=token) == page
