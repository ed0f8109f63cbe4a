"""A large first copy, streamed: pages of the primary's records at the hold's generation written in
batches while the next page is fetched.

The replica's store stages the copy (``Store.stage_first_copy``, see :mod:`diffstore.engine.first_copy`):
each batch is its own write transaction and records where the copy goes on, and the collection stays
invisible (``noSuchCollection``; ``copying`` in ``GET /replica``) until the last batch commits it. Memory
holds one batch and the page being fetched, by one fetcher thread that lives as long as the copy. After a
crash the staged row says where to go on (:func:`stream`'s ``from_key``); the hold on the primary has kept
the generation's records meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from diffstore.engine import crashpoints
from diffstore.engine.store import Store
from diffstore.engine.types import GenerationRecords, ReplicaGeneration

Fetch = Callable[[bytes | None], GenerationRecords]

# records written a transaction: each durable commit costs a few ms here (NOTES.md), a batch of 10,000
# records ~10 ms; 50,000 make the commits a small part of the copy while memory stays a few MiB
BATCH_RECORDS = 50_000


class Abandoned(Exception):
    """The staged copy is not there any more (dropped meanwhile): nothing more was written."""


def stream(
    store: Store,
    name: str,
    generation_id: bytes,
    fetch: Fetch,
    from_key: bytes | None,
    last: Callable[[list[tuple[bytes, bytes | None]]], ReplicaGeneration],
    batch_records: int = BATCH_RECORDS,
) -> None:
    """Writes the pages ``fetch`` answers from ``from_key`` on into the staged copy of ``name`` at
    ``generation_id``, about ``batch_records`` records a transaction, the next page fetched while a batch
    is written; the last batch goes in with ``last(records)``, which commits the copy.

    Raises:
        Abandoned: the staged copy was dropped meanwhile.
        DiffstoreError: the primary failed to answer (the copy goes on from the last batch next time).
    """
    batch: list[tuple[bytes, bytes | None]] = []
    with ThreadPoolExecutor(1, thread_name_prefix="diffstore-replica-fetch") as fetcher:
        pending: Future[GenerationRecords] = fetcher.submit(fetch, from_key)
        while True:
            page = pending.result()
            batch.extend(page.records)
            if page.next_key is None:
                if not store.finish_first_copy(last(batch)):
                    raise Abandoned(f"the first copy of {name!r} was dropped meanwhile")
                return
            pending = fetcher.submit(fetch, page.next_key)  # fetched while this batch is written
            if len(batch) < batch_records:
                continue
            try:
                written = store.stage_first_copy_batch(name, generation_id, batch, page.next_key)
            except BaseException:
                pending.cancel()
                raise
            if not written:
                raise Abandoned(f"the first copy of {name!r} was dropped meanwhile")
            batch = []
            crashpoints.reached("first-copy-batch")  # tests: a copy cut here goes on after a restart
