"""``diffstore transform --create-target`` when another runner creates the target at the same moment.

Two runners of one target started together both saw it missing and both created it: the second got 409
``collectionExists`` and exited 1 (found by the soak, issue 52). Here the target is created by another
client between the runner's listing and its create (the race made deterministic); the check must take
the collection that now exists, and still refuse one that is not manual.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.client import Client
from diffstore.errors import NotManual
from diffstore.spark import cli
from tests.helpers import LiveServer, running_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with running_server(tmp_path / "db") as live:
        yield live


def args(url: str) -> argparse.Namespace:
    return argparse.Namespace(url=url, token=None, target="C", create_target=True)


def created_by_another_runner(monkeypatch: pytest.MonkeyPatch, url: str, manual: bool) -> None:
    """The other runner's create lands just before this runner's own."""
    original = Client.create_collection

    def racing(self: Client, name: str, *a: object, **kw: object) -> object:
        with Client(url) as other:
            original(other, name, manual=manual)
        return original(self, name, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Client, "create_collection", racing)


def test_a_missing_target_is_created_manual(server: LiveServer) -> None:
    with server.client() as client:
        client.create_collection("A", manual=True)
    cli.check_collections(args(server.url), {"a": "A"})
    with server.client() as client:
        assert client.collection("C").manual


def test_a_target_created_meanwhile_by_another_runner_is_taken(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server.client() as client:
        client.create_collection("A", manual=True)
    created_by_another_runner(monkeypatch, server.url, manual=True)
    cli.check_collections(args(server.url), {"a": "A"})
    with server.client() as client:
        assert client.collection("C").manual


def test_an_automatic_target_created_meanwhile_is_still_refused(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server.client() as client:
        client.create_collection("A", manual=True)
    created_by_another_runner(monkeypatch, server.url, manual=False)
    with pytest.raises(NotManual):
        cli.check_collections(args(server.url), {"a": "A"})
