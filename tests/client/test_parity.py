"""The client's handle answers exactly like the engine's Collection for the same calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffstore.client import Client
from diffstore.engine.store import Store
from diffstore.engine.types import ReaderUpdate, StoreConfig


def scenario(store: Any) -> list[Any]:
    """The same calls on an engine Store or a Client; returns every answer."""
    out: list[Any] = []
    c = store.create_collection("P", manual=True, initial_generation_id=b"\x00")
    store.create_collection("Q", manual=False)
    out.append(store.collections())
    c.create_reader("r", generation_id=b"\x00")
    c.create_reader("keep", generation_id=b"\x00")  # pins every generation: no answer depends on GC timing
    c.create_reader("q", collection="Q")
    for n in range(1, 4):
        g = bytes([0, n])
        c.start_generation(g)
        out.append(c.put_many([(bytes([k, n % 2]), b"v%d" % n) for k in range(0, 12, n)], generation_id=g))
        out.append(c.put(b"\xff", None if n == 2 else b"x", generation_id=g, if_not_present=n == 3))
        c.commit_generation(
            g, update_readers=[ReaderUpdate("r", g, expected=bytes([0, n - 1]) if n > 1 else b"\x00")]
        )
    phantom = c.start_phantom()
    c.put(b"\x01\x01", b"ghost", generation_id=b"\x00\x03", phantom_id=phantom)
    out.append((c.generation_id, c.next_generation_id, c.manual, c.readers()))
    out.append([c.get_result(k) for k in (b"\x00\x01", b"\xff", b"zz")])
    out.append(c.get(b"\x01\x01", phantom_id=phantom))
    out.append(c.get(b"\x03\x00", generation_id=b"\x00\x01"))
    out.append([(r.key, r.value) for r in c.query()])
    out.append([(r.key, r.value) for r in c.query(from_key=b"\x04", to_key=b"\x08", phantom_id=phantom)])
    out.append(list(c.diff(from_generation_id=b"\x00", include_intermediate=True)))
    out.append(list(c.diff(from_reader="r")))
    out.append(list(c.diff(from_generation_id=b"\x00\x01", to_generation_id=b"\x00\x02")))
    page = c.diff_page(from_generation_id=b"\x00", limit=3)
    out.append((page.from_generation_id, page.to_generation_id, page.items, page.cursor is not None))
    out.append(c.keys_around(b"\x05\x01", 3))
    out.append(c.keys_around(b"\x05\x05", 2, require_key_existence=False))
    out.append(c.splits(3))
    c.update_reader("q", b"", expected=None)
    c.delete_reader("r")
    out.append(c.readers())
    return out


def test_client_and_engine_give_the_same_answers(tmp_path: Path, server: Any) -> None:
    with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as store:
        expected = scenario(store)
    with Client(server.url) as client:
        assert scenario(client) == expected
