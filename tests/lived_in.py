"""A store with a life behind it: one generator for the tests of replicas, promotion, backups, compact, check.

Every test that builds a fresh store misses what a store looks like after a week of pipelines: history
collected by GC, readers that moved (in commits and outside them), readers of other collections and of
stream shards, leases, consumers' checkpoints, a collection deleted and one created again under the same
name, an open generation, phantoms, keys of 1 MiB, empty collections. :func:`live` makes all of them by
real rounds of writes, reader moves and a real :class:`~diffstore.consumer.Consumer`, through the public
API of either an engine ``Store`` (a data directory) or a ``Client`` (a running server): both have
``create_collection``, ``collection``, ``delete_collection``.

API::

    life = live(store_or_client)          # a few seconds; returns a LivedIn
    life.more(store_or_client, rounds=2)   # more rounds of the pipeline (e.g. during a fault)
    life.names                             # every collection it leaves (sorted)
    life.SOURCE, life.TARGET, ...          # the collection of each shape (class constants below)

The shapes, by collection (all names are class constants of :class:`LivedIn`):

- ``SOURCE`` (manual): one generation a round; ``TARGET``'s reader ``from_source`` follows it, so its
  first generations are collected (reads there answer 410) -- every pipeline source looks like this.
- ``TARGET`` (manual): the transform's target; each commit moves ``from_source`` (-> SOURCE),
  ``from_auto`` (-> AUTO) and ``hstream/sub/0`` (-> ``hstream://events``, a stream shard, as ingestion
  does) with commit metadata; holds the lease ``transform`` (renewed: version 2).
- ``AUTO`` (automatic): written each round; a self-reader ``compactor`` moved outside commits; a phantom
  with records (never replicated, never in a diff).
- ``CHECKPOINT`` (manual): a consumer's checkpoint over AUTO and SOURCE, moved by the consumer's commits.
- ``AGAIN``: written, deleted, created again under the same name with other records (its ids restart).
  ``GONE`` was deleted and is not there any more (not in ``names``).
- ``OPEN`` (manual): committed generations and an open next one holding uncommitted records.
- ``BIG`` (manual): two keys of ``key_bytes`` (default 1 MiB) sharing a long prefix, and short keys.
- ``EMPTY`` (manual, never written) and ``EMPTY_AUTO`` (automatic, never written).

Where GC runs: on a ``Store`` :func:`live` runs its background steps until none is left; a server runs
GC itself (reads below a reader's minimum answer 410 either way).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from diffstore.consumer import Consumer, WindowListener
from diffstore.engine.types import ReaderUpdate

WAIT_S = 60.0


def _is_store(target: Any) -> bool:
    return hasattr(target, "run_background_once")


def _settle(target: Any) -> None:
    """On a Store: runs due automatic commits and GC until nothing is left (a server does it itself)."""
    if _is_store(target):
        for _ in range(1_000):
            if not target.run_background_once(time.monotonic() + 3600):
                break


def _wait_auto_commit(target: Any, name: str, before: bytes) -> bytes:
    """Waits until the automatic collection ``name`` committed past ``before``; its new generation."""
    deadline = time.monotonic() + WAIT_S
    collection = target.collection(name)
    while True:
        _settle(target)
        current = collection.generation_id
        if current != before:
            return bytes(current)
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} did not commit within {WAIT_S}s")
        time.sleep(0.01)


@dataclass
class LivedIn:
    """What :func:`live` left (see the module); :meth:`more` adds rounds."""

    SOURCE = "source"
    TARGET = "target"
    AUTO = "auto"
    CHECKPOINT = "checkpoint"
    AGAIN = "again"
    GONE = "gone"
    OPEN = "open"
    BIG = "big"
    EMPTY = "empty"
    EMPTY_AUTO = "empty-auto"
    STREAM = "hstream://events"

    rounds: int = 0
    key_bytes: int = 1 << 20
    consumed: list[bytes] = field(default_factory=list)  # keys the consumer saw (it really ran)

    @property
    def names(self) -> list[str]:
        """Every collection :func:`live` leaves, sorted bytewise (as ``GET /collections/`` lists them)."""
        names = [
            self.SOURCE, self.TARGET, self.AUTO, self.CHECKPOINT, self.AGAIN, self.OPEN, self.BIG,
            self.EMPTY, self.EMPTY_AUTO,
        ]  # fmt: skip
        return sorted(names, key=str.encode)

    def more(self, target: Any, rounds: int = 1) -> None:
        """``rounds`` more rounds of the pipeline: SOURCE and AUTO written, TARGET committed moving its
        readers, the consumer run, AUTO's self-reader moved, GC (see the module)."""
        for _ in range(rounds):
            self.rounds += 1
            n = self.rounds
            source = target.collection(self.SOURCE)
            g = b"g%04d" % n
            source.start_generation(g)
            source.put_many(
                [(b"s%03d" % (i + n), b"v%d" % n) for i in range(20)] + [(b"s%03d" % (n - 1), None)],
                generation_id=g,
            )
            source.commit_generation(g, metadata={"round": str(n)})
            auto = target.collection(self.AUTO)
            before = auto.generation_id
            auto.put_many([(b"a%d" % (n % 5), b"%d" % n), (b"round", b"%d" % n)])
            auto_at = _wait_auto_commit(target, self.AUTO, before)
            tgt = target.collection(self.TARGET)
            t = b"t%04d" % n
            tgt.start_generation(t)
            tgt.put_many([(b"sum", b"%d" % n), (b"t%d" % n, g)], generation_id=t)
            position = (n * 7).to_bytes(8, "big") + (0).to_bytes(4, "big")  # a stream RecordId
            tgt.commit_generation(
                t,
                [
                    ReaderUpdate("from_source", g),
                    ReaderUpdate("from_auto", auto_at),
                    ReaderUpdate("hstream/sub/0", position),
                ],
                metadata={"source": g.decode(), "round": str(n)},
            )
            self._consume(target)
            auto.update_reader("compactor", auto_at)  # a reader moved outside commits
            _settle(target)

    def _consume(self, target: Any) -> None:
        seen = self.consumed

        class Listener(WindowListener):
            def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
                seen.append(key)

        Consumer(target, [self.AUTO, self.SOURCE], self.CHECKPOINT, Listener()).run_pending()


def live(target: Any, *, rounds: int = 3, key_bytes: int = 1 << 20) -> LivedIn:
    """Gives ``target`` (an engine ``Store`` or a ``Client``, holding no collection of these names) a life
    behind it: every shape of the module, after ``rounds`` rounds of the pipeline (at least 2, so that
    SOURCE has collected history)."""
    life = LivedIn(key_bytes=key_bytes)
    target.create_collection(life.SOURCE, manual=True)
    target.create_collection(life.AUTO, manual=False)
    tgt = target.create_collection(life.TARGET, manual=True, initial_generation_id=b"t0000")
    tgt.create_reader("from_source", life.SOURCE, None)
    tgt.create_reader("from_auto", life.AUTO, None)
    tgt.create_reader("hstream/sub/0", life.STREAM, None)
    lease = tgt.acquire_lease("transform", "worker-1", 3_600_000)
    tgt.renew_lease("transform", "worker-1", lease.version)
    target.collection(life.AUTO).create_reader("compactor", generation_id=None)

    # created, written, deleted; and created again under the same name with other records
    for name in (life.AGAIN, life.GONE):
        first = target.create_collection(name, manual=True)
        for g in (b"1", b"2", b"3"):
            first.start_generation(g)
            first.put(b"old-" + g, g, generation_id=g)
            first.commit_generation(g)
        target.delete_collection(name)
    again = target.create_collection(life.AGAIN, manual=True)
    again.start_generation(b"1")
    again.put(b"new", b"1", generation_id=b"1")
    again.commit_generation(b"1")

    opened = target.create_collection(life.OPEN, manual=True)
    opened.start_generation(b"1")
    opened.put_many([(b"o1", b"1"), (b"o2", b"2")], generation_id=b"1")
    opened.commit_generation(b"1")
    opened.start_generation(b"2")
    opened.put_many([(b"o1", None), (b"o3", b"uncommitted")], generation_id=b"2")

    big = target.create_collection(life.BIG, manual=True)
    prefix = b"P" * 300
    big.start_generation(b"1")
    for i in (1, 2):
        big.put(prefix + bytes([i]) * (key_bytes - len(prefix)), b"big-%d" % i, generation_id=b"1")
    big.put_many([(b"small-%d" % i, b"x" * i) for i in range(5)], generation_id=b"1")
    big.commit_generation(b"1")

    target.create_collection(life.EMPTY, manual=True)
    target.create_collection(life.EMPTY_AUTO, manual=False)
    target.create_collection(life.CHECKPOINT, manual=True)

    life.more(target, max(2, rounds))
    auto = target.collection(life.AUTO)
    phantom = auto.start_phantom(3600)
    auto.put(b"what-if", b"phantom", generation_id=auto.generation_id, phantom_id=phantom)
    _settle(target)
    return life
