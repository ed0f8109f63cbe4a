"""A writer that runs through fail-overs: each write is one generation sent to EVERY member, so that the
answers themselves show whether two members ever accepted writes at once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from diffstore.client import Client, Collection
from diffstore.errors import DiffstoreError
from tests.ha.conftest import Member

COLLECTION = "w"


def key(n: int) -> bytes:
    return b"k%08d" % n


def generation(n: int) -> bytes:
    return b"%08d" % n


@dataclass
class Acks:
    """What the writer saw: for each write number, the members that acknowledged it, and when."""

    by_write: dict[int, list[str]] = field(default_factory=dict)
    at: dict[int, float] = field(default_factory=dict)

    def acked(self) -> list[tuple[int, str]]:
        return sorted((n, names[0]) for n, names in self.by_write.items() if names)

    def first_ack_by_other_than(self, name: str, after: float) -> float | None:
        later = [
            self.at[n]
            for n, names in self.by_write.items()
            if names and names[0] != name and self.at[n] > after
        ]
        return min(later) if later else None


class Writer:
    """Writes generation after generation to every member (see the module) until :meth:`stop`."""

    def __init__(self, members: list[Member], timeout_s: float = 2.0) -> None:
        self.members = members
        self.timeout_s = timeout_s
        self.acks = Acks()
        self.n = 1_000
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ha-writer", daemon=True)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> Acks:
        self._stop.set()
        self._thread.join(60)
        return self.acks

    def _run(self) -> None:
        clients = {m.name: Client(m.url, timeout_s=self.timeout_s) for m in self.members}
        try:
            while not self._stop.is_set():
                self.n += 1
                names: list[str] = []
                for member in self.members:
                    c = Collection(clients[member.name], COLLECTION, True)
                    try:
                        c.write_generation(
                            generation(self.n), [(key(self.n), member.name.encode())], abort_outdated=True
                        )
                    except (DiffstoreError, OSError):
                        continue
                    names.append(member.name)
                with self._lock:
                    self.acks.by_write[self.n] = names
                    self.acks.at[self.n] = time.monotonic()
                self._stop.wait(0.02)
        finally:
            for client in clients.values():
                client.close()
