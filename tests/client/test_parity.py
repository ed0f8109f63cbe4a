"""The client's handle answers exactly like the engine's Collection for the same calls, and the async
client has the sync client's methods with the same parameters."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from diffstore import Collection as AnyCollection
from diffstore.client import AsyncClient, AsyncCollection, Client, Collection
from diffstore.engine.collection import Collection as EngineCollection
from diffstore.engine.store import Store
from diffstore.engine.types import ReaderUpdate, StoreConfig
from diffstore.wire_requests import (
    DiffRequest,
    GetManyRequest,
    GetRequest,
    KeysAroundRequest,
    PutManyRequest,
    PutRequest,
    QueryRequest,
    ReadAt,
    WriteOptions,
)
from diffstore.wire_revert import RevertRequest


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
        # a new key each time: putMany's answer has no wasPut (SPEC §3), so the client cannot tell "none put"
        extra = [(b"\x00\x01", b"kept?"), (bytes([0xFE, n]), b"new")]
        out.append(c.put_many(extra, generation_id=g, if_not_present=n == 3))
        c.commit_generation(
            g, update_readers=[ReaderUpdate("r", g, expected=bytes([0, n - 1]) if n > 1 else b"\x00")]
        )
    phantom = c.start_phantom()
    c.put(b"\x01\x01", b"ghost", generation_id=b"\x00\x03", phantom_id=phantom)
    out.append((c.generation_id, c.next_generation_id, c.manual, c.readers()))
    out.append([c.get_result(k) for k in (b"\x00\x01", b"\xff", b"zz")])
    out.append(c.get(b"\x01\x01", phantom_id=phantom))
    out.append(c.get_many([b"\x00\x01", b"zz", b"\xff", b"\x00\x01", b"\x03\x01"]))
    out.append(c.get_many([b"\x01\x01", b"\x03\x00"], generation_id=b"\x00\x03", phantom_id=phantom))
    out.append(c.get_many([b"\x03\x00", b"\x03\x01"], generation_id=b"\x00\x01"))
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
    out.append(c.splits(2, from_generation_id=b"\x00"))  # the keys changed since the first generation
    out.append(c.splits(2, b"\x00\x02", from_generation_id=b""))
    c.start_generation(b"\x00\x04")
    c.put(b"\x00\x01", b"open", generation_id=b"\x00\x04")
    out.append(c.revert(b"\x00\x01", generation_id=b"\x00\x04"))
    out.append([(r.key, r.value) for r in c.query(generation_id=b"\x00\x04")])
    c.abort_generation(b"\x00\x04")
    c.create_reader("w", generation_id=b"\x00")
    update = ReaderUpdate("w", b"\x00\x03", expected=b"\x00")
    out.append(c.write_generation(b"\x00\x05", [(b"\xfd", b"w")], [update], metadata={"m": "1"}))
    out.append((c.generation_state(), c.get(b"\xfd"), c.history(limit=1)[0][0].metadata))
    c.update_reader("q", b"", expected=None)
    c.delete_reader("r")
    out.append(c.readers())
    return out


def test_client_and_engine_give_the_same_answers(tmp_path: Path, server: Any) -> None:
    with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as store:
        expected = scenario(store)
    with Client(server.url) as client:
        assert scenario(client) == expected


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member)
    }


def _shape(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults (annotations differ: sync vs async types)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(("sync", "twin"), [(Client, AsyncClient), (Collection, AsyncCollection)])
def test_the_async_twins_have_the_sync_methods_and_parameters(sync: type, twin: type) -> None:
    """The sync and async clients are written twice (by hand); this holds them together."""
    sync_methods, twin_methods = _public_methods(sync), _public_methods(twin)
    # (properties are not compared: the async handle reads generation ids with ``state()``)
    assert set(sync_methods) == set(twin_methods)
    for name, signature in sync_methods.items():
        assert _shape(signature) == _shape(twin_methods[name]), name
        iterates = name in ("query", "diff", "watch")
        assert inspect.iscoroutinefunction(getattr(twin, name)) is not iterates, name


# Tuning of the in-process engine alone: over HTTP the server applies its own (a revert's batch size).
ENGINE_ONLY_PARAMETERS = {("revert", "batch_keys")}


def test_the_client_collection_has_every_engine_method_with_its_parameters() -> None:
    engine = _public_methods(EngineCollection)
    client = _public_methods(Collection)
    for name, signature in engine.items():
        assert name in client, name
        engine_params = [
            p for p in _shape(signature) if p[0] != "self" and (name, p[0]) not in ENGINE_ONLY_PARAMETERS
        ]
        client_params = [p for p in _shape(client[name]) if p[0] != "self"]
        assert client_params[: len(engine_params)] == engine_params, name


def request_scenario(c: AnyCollection) -> list[Any]:
    """The same request objects run on an engine or a client handle (routes run them on the engine's)."""
    c.start_generation(b"1")
    options = WriteOptions(generation_id=b"1")
    out: list[Any] = [
        PutManyRequest([(b"a", b"1"), (b"b", b"2"), (b"c", None)], options).run(c),
        PutRequest((b"a", b"kept", True), options).run(c),
    ]
    c.commit_generation(b"1")
    out += [
        GetRequest(b"a").run(c),
        GetRequest(b"zz", ReadAt(generation_id=b"0")).run(c),
        GetManyRequest([b"a", b"zz", b"c", b"a"]).run(c),
        GetManyRequest([b"a"], ReadAt(generation_id=b"0")).run(c),
        KeysAroundRequest(b"a", True, 5).run(c),
        QueryRequest(from_key=b"b").run(c),
        DiffRequest(from_generation_id=b"", include_intermediate=True).run(c),
        DiffRequest.of(to_generation_id=b"1", limit=1).run(c).items,
    ]
    c.start_generation(b"2")
    out.append(RevertRequest(b"0", b"2").run(c))
    c.abort_generation(b"2")
    return out


def test_one_request_object_runs_on_both_collections(tmp_path: Path, server: Any) -> None:
    with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as store:
        expected = request_scenario(store.create_collection("R", manual=True, initial_generation_id=b"0"))
    with Client(server.url) as client:
        assert request_scenario(client.create_collection("R", initial_generation_id=b"0")) == expected
