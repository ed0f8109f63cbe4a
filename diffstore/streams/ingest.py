"""Exactly-once ingestion of one HStream subscription into one manual collection (SPEC §5).

Per window, one round of :mod:`diffstore.rounds`: start the next generation of C; put_many the window's
mapped records; commit the generation together with the reader updates
``hstream/<subscriptionId>/<shardId>`` → last applied RecordId (12 bytes big-endian); only then ack the
window's records. A crash anywhere before the commit leaves C unchanged (the open generation is aborted at
the next start) and the records unacked (they come again); a crash after the commit but before the acks is
harmless: the records come again and are at or below the committed positions, so they are acked and skipped.

Contiguous positions: a stored position says "every record of this shard up to here was applied", and a record
at or below it is skipped; so a position must never pass a record that was not applied. After a start, a
reconnect or an owner change (a paused or dead ingestor's shards move to the next one), the server may deliver
a shard's newer batches before the older ones that were in flight to the previous consumer; committing them
would move the position past the older ones, which would then be skipped: lost. The
:class:`~diffstore.streams.ingest_window.WindowAccumulator` therefore holds, per shard, records above a
frontier until they are known to follow it: within a batch by index, across batches by the subscription's
committed position (GetSubscription's offsets, asked by :meth:`Ingestor._probe`: every record before that
batch is acked, hence applied), and once the shard is in order for the current call: a record above its *mark*
is here, the tail read ``recovery_hold_ms`` after the shard's first delivery on that call, by when the server
has resent what was in flight elsewhere (``None`` = automatic: 0 for the embedded server, which resends at
once on an owner change, ahead of newer batches; the subscription's ack timeout plus a second otherwise:
HStreamDB resends only at the deadline). See that module for why this is enough.

High availability (``lease_ttl_ms``): any number of ingestors may run on one subscription and collection.
They compete for the lease ``ingest:<subscriptionId>`` of C (:mod:`diffstore.lease_keeper`): the holder is
active, the others stand by -- without consuming, so the server hands every shard to the active one. Every
round of the active one carries the lease's fencing token, so once its lease moved (it paused, or was cut
off) nothing of it commits. When it loses the lease it stops consuming without acking its open window (the
records go to the next consumer) and stands by again; a standby that takes over starts like a restarted
ingestor: from the positions stored in C, which is what makes takeovers exactly once.

Outages (``IngestConfig.outage``, :mod:`diffstore.backoff`): a call that does not reach the diffstore server
or the streams server (a restart, a broken link) does not end :meth:`Ingestor.run`. The active loop ends as
if the ingestor had died -- the window being written and the open one stay unacked, so the streams server
sends them again -- waits the policy's back-off and starts afresh from the positions stored in C, which is
what makes a restart exactly once: a window whose commit reached the store before the link broke is skipped
when it comes again, never applied twice. The subscriber rides out the streams server by itself
(:class:`~diffstore.streams.subscriber.StreamSubscriber` reconnects with the same policy), so records that
are already here keep being written while the streams server is away.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter

from diffstore import shell
from diffstore.backoff import RetryPolicy
from diffstore.engine.history import MAX_METADATA_BYTES
from diffstore.engine.types import LeaseToken
from diffstore.errors import DiffstoreError, GenerationMismatch, LeaseLost, OutdatedGeneration
from diffstore.lease_keeper import LeaseConfig, LeaseGuard
from diffstore.outage import OutageWatch, is_outage
from diffstore.rounds import Round, ensure_readers, shard_reader, shard_reader_target
from diffstore.streams.client import StreamClient, StreamError, StreamUnavailable
from diffstore.streams.ingest_window import IngestWindow, WindowAccumulator
from diffstore.streams.records import RecordFlag, RecordPosition, StreamRecord, compact_json
from diffstore.streams.sinks import CollectionSink, PutItem
from diffstore.streams.subscriber import StreamSubscriber, SubscriberConfig

MapperResult = tuple[bytes | str, bytes | None] | Iterable[tuple[bytes | str, bytes | None]] | None
Mapper = Callable[[StreamRecord], MapperResult]
EMBEDDED_SERVER_MARK = "diffstore"
PROBE_INTERVAL_S = 0.01  # between two questions to the server about held records
PROBE_CONNECT_S = 2.0  # how long a check that the streams server is back waits for a connection
_log = logging.getLogger("diffstore.ingest")
_FLAG = attrgetter("flag")
_PARTITION_KEY = attrgetter("partition_key")
_PAYLOAD = attrgetter("payload")


def default_mapper(record: StreamRecord) -> tuple[bytes, bytes]:
    """Key = the partition key; value = the RAW payload, or compact sorted-keys JSON for JSON records."""
    if record.flag is RecordFlag.JSON:
        return record.partition_key.encode(), compact_json(record.json())
    return record.partition_key.encode(), record.payload


def load_mapper(spec: str) -> Mapper:
    """Resolves ``module:function`` to a callable (the current directory is importable).

    Raises :class:`~diffstore.errors.InvalidRequest` with a one-line message naming ``--mapper``.
    """
    return shell.load_callable(spec, "--mapper")


def map_records(mapper: Mapper, records: Iterable[StreamRecord]) -> list[PutItem]:
    """Applies ``mapper`` to each record: ``None`` drops it, a ``(key, value)`` pair or a list of pairs
    are written (``value`` ``None`` is a tombstone; ``str`` keys are UTF-8 encoded)."""
    if mapper is default_mapper:
        records = records if isinstance(records, list) else list(records)
        if RecordFlag.JSON not in map(_FLAG, records):  # all RAW: no Python code per record
            keys = map(str.encode, map(_PARTITION_KEY, records))
            return list(zip(keys, map(_PAYLOAD, records), strict=True))
        return [default_mapper(r) for r in records]
    items: list[PutItem] = []
    for record in records:
        result = mapper(record)
        if result is None:
            continue
        pairs = [result] if isinstance(result, tuple) else result
        for key, value in pairs:
            items.append((key.encode() if isinstance(key, str) else key, value))
    return items


@dataclass(frozen=True, slots=True)
class IngestConfig:
    """One ingestor: subscription → manual collection.

    Attributes:
        subscription_id: the HStream subscription to consume.
        window_records / window_ms: a window (one generation) closes at this many records or this age.
        mapper: record → items (default :func:`default_mapper`).
        recovery_hold_ms: how long after a shard's first delivery on a call the server may still resend
            records in flight elsewhere; see the module docstring (``None``: automatic).
        consumer: tuning of the underlying consumer.
        lease_ttl_ms: keep the lease :func:`lease_name` of the collection with this ttl, so that
            several ingestors can run, one active and the others standby (see the module docstring);
            ``None`` (the default of the Python API): no lease, one ingestor. ``diffstore ingest`` keeps
            one of :data:`diffstore.lease_keeper.DEFAULT_TTL_MS` (10 s) unless told otherwise.
        lease_owner: this ingestor's name in the lease (default: unique per process).
        outage: how to ride out a diffstore or streams server that does not answer (see the module
            docstring; default: retry for ever with bounded back-off); ``None``: the first such failure
            ends :meth:`Ingestor.run` with its error.
    """

    subscription_id: str
    window_records: int = 10_000
    window_ms: float = 500.0
    mapper: Mapper | None = None
    recovery_hold_ms: float | None = None
    consumer: SubscriberConfig | None = None
    lease_ttl_ms: int | None = None
    lease_owner: str | None = None
    outage: RetryPolicy | None = RetryPolicy()

    def __post_init__(self) -> None:
        if not self.subscription_id:
            raise ValueError("subscription_id is required")
        if self.window_records < 1 or self.window_ms < 0:
            raise ValueError("window_records must be >= 1 and window_ms >= 0")
        self.lease()  # validates the lease settings

    def lease(self) -> LeaseConfig | None:
        """The lease this ingestor keeps (None: none)."""
        if self.lease_ttl_ms is None:
            return None
        return LeaseConfig(lease_name(self.subscription_id), self.lease_owner or "", self.lease_ttl_ms)


@dataclass(frozen=True, slots=True)
class CommitStats:
    """Reported after every committed window."""

    generation_id: bytes
    records: int
    items: int
    applied_total: int
    skipped_total: int
    lag_s: float
    positions: dict[int, RecordPosition]
    shard_lag_s: dict[int, float] = field(default_factory=dict)  # lag of the shards this window read


def window_metadata(subscription_id: str, stream_name: str, window: IngestWindow) -> dict[str, str]:
    """What a window's commit records with its generation (SPEC §8, ``history()``): ``subscription``,
    ``stream``, ``records`` (how many stream records it applied) and, per shard it read,
    ``shard.<id>`` = ``first..last``, the positions (``batchId-batchIndex``) of its first and last record of
    that shard. Shards that would pass the 4 KiB limit are left out, counted in ``shards.omitted``."""
    first: dict[int, RecordPosition] = {}
    for record in window.records:  # in apply order: by shard, then position
        first.setdefault(record.record_id.shard_id, record.record_id.position)
    metadata = {"subscription": subscription_id, "stream": stream_name, "records": str(len(window.records))}
    room = MAX_METADATA_BYTES - _json_size(metadata) - len(',"shards.omitted":"0000000000"')
    omitted = 0
    for shard_id in sorted(window.positions):
        key = f"shard.{shard_id}"
        value = f"{_position_text(first.get(shard_id, window.positions[shard_id]))}.."
        value += _position_text(window.positions[shard_id])
        size = _json_size({key: value})  # one entry's "{...}": its comma stands for a brace
        if size - 1 > room:
            omitted += 1
            continue
        metadata[key] = value
        room -= size - 1
    if omitted:
        metadata["shards.omitted"] = str(omitted)
    return metadata


def _position_text(position: RecordPosition) -> str:
    return f"{position.batch_id}-{position.batch_index}"


def _json_size(metadata: dict[str, str]) -> int:
    """Bytes of ``metadata`` encoded as the limit counts them (compact UTF-8 JSON)."""
    return len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode())


def lease_name(subscription_id: str) -> str:
    """The lease of the ingestors of a subscription: ``ingest:<subscriptionId>`` (``/`` becomes ``_``: a
    lease name is a URL path segment)."""
    return "ingest:" + subscription_id.replace("/", "_")


OutageListener = Callable[[str, bool], None]
"""Told ``("diffstore" | "streams", True)`` when that server stops answering, ``(..., False)`` when it is
back."""

StateListener = Callable[[str, LeaseToken | None], None]
"""Told ``("active", token)`` when an ingestor with a lease starts consuming, ``("standby", None)`` when it
stands by (at start, and after losing its lease)."""


class Ingestor:
    """Runs the SPEC §5 loop until stopped; an outage is ridden out (``IngestConfig.outage``), any other
    sink or stream error ends :meth:`run` with that error."""

    def __init__(
        self,
        client: StreamClient,
        sink: CollectionSink,
        config: IngestConfig,
        on_outage: OutageListener | None = None,
    ) -> None:
        self.client = client
        self.sink = sink
        self.config = config
        self.mapper: Mapper = config.mapper or default_mapper
        self.stop_event = threading.Event()
        self.applied_total = 0
        self.skipped_total = 0
        self.stream_name = ""
        self._readers: dict[int, str] = {}
        self._accumulator: WindowAccumulator | None = None
        self._token: LeaseToken | None = None
        self.takeovers = 0  # how many times this ingestor became active (with a lease)
        self.restarts = 0  # how many times an outage restarted the active loop
        policy = config.outage or RetryPolicy()

        def listener(server: str) -> Callable[[bool], None] | None:
            return None if on_outage is None else lambda waiting: on_outage(server, waiting)

        self.store_watch = OutageWatch("the diffstore server", policy, _log, listener("diffstore"))
        self.stream_watch = OutageWatch(
            f"the streams server {client.config.url}", policy, _log, listener("streams")
        )

    @property
    def open_window_records(self) -> int:
        """Records gathered in the open window, not yet being written (for progress displays and tests)."""
        return 0 if self._accumulator is None else len(self._accumulator)

    def stop(self) -> None:
        """Asks :meth:`run` to commit its open window and return."""
        self.stop_event.set()

    def prepare(self) -> WindowAccumulator:
        """Aborts a dead ingestor's open generation, ensures the position readers, loads positions.

        With a lease the open generation is left to the first round's fenced start, which discards it
        only while this ingestor still holds the lease (an unfenced abort could hit a newer holder's).
        """
        subscription = self.client.get_subscription(self.config.subscription_id).subscription
        self.stream_name = subscription.streamName
        collection = self.sink.collection
        _, open_next = collection.generation_state()
        if open_next is not None and self._token is None:
            collection.abort_generation(open_next)  # an uncommitted window of a dead ingestor
        for shard in self.client.list_shards(self.stream_name):
            self._readers[shard.shard_id] = shard_reader(self.config.subscription_id, shard.shard_id)
        target = shard_reader_target(self.stream_name)
        stored = ensure_readers(collection, {name: target for name in self._readers.values()})
        positions: dict[int, RecordPosition] = {}
        for shard_id, name in self._readers.items():
            generation = stored[name].generation_id
            if generation:
                positions[shard_id] = RecordPosition.from_bytes(generation)
        return WindowAccumulator(
            self.config.window_records, self.config.window_ms, positions, resend_s=self._recovery_hold_s()
        )

    def _recovery_hold_s(self) -> float:
        if self.config.recovery_hold_ms is not None:
            return self.config.recovery_hold_ms / 1000
        cluster = self.client.describe_cluster()
        versions = [n.version.version for n in cluster.serverNodes]
        if versions and all(EMBEDDED_SERVER_MARK in v for v in versions):
            return 0.0
        subscription = self.client.get_subscription(self.config.subscription_id).subscription
        return float(subscription.ackTimeoutSeconds) + 1.0

    def run(
        self,
        on_commit: Callable[[CommitStats], None] | None = None,
        on_state: StateListener | None = None,
    ) -> None:
        """Consumes and applies windows until :meth:`stop`; the open window is committed before returning.

        One window at a time is written by a worker thread while the next one is gathered; the next is
        handed over only after the previous commit, so generations and acks stay strictly in order.
        With a lease (``IngestConfig.lease_ttl_ms``) it stands by until it holds the lease, consumes while
        it holds it, stands by again when it loses it, and releases it when stopped. An outage restarts the
        active loop after its back-off (see the module docstring), under the same lease while it still
        holds.
        """
        lease = self.config.lease()
        if lease is None:
            while not self._attempt(lambda: self._run_active(on_commit, None)):
                pass
            return
        with LeaseGuard(self.sink.collection, lease) as guard:
            held: LeaseToken | None = None  # the lease of the last active loop, kept across an outage

            def active() -> None:
                self._run_active(on_commit, guard)

            while not self.stop_event.is_set():
                if on_state is not None and (held is None or not guard.holds(held)):
                    on_state("standby", None)
                token = guard.wait_active(self.stop_event)
                if token is None:
                    break
                if token != held:
                    self.takeovers += 1
                    if on_state is not None:
                        on_state("active", token)
                held = self._token = token
                try:
                    if self._attempt(active, guard):
                        held = None  # the lease was lost (or the ingestor stopped): stand by
                finally:
                    self._token = None

    def _attempt(self, body: Callable[[], None], guard: LeaseGuard | None = None) -> bool:
        """Runs the active loop ``body``: True once it returned (or the ingestor was stopped during an
        outage), False when an outage ended it and the server answers again (run it again). Any other
        error, and an outage past the policy's limit, is raised.

        The server is asked directly after each back-off, so that the end of the outage is known (and
        logged) even when the loop does not run again at once: a lease lost meanwhile makes it stand by.

        With a lease the next loop runs under a new version of it: a request of this loop that the link
        held back and delivers late is then fenced (under the same version it could write into the next
        loop's generation, which reuses the generation id of a window that did not commit)."""
        try:
            body()
            return True
        except (DiffstoreError, StreamError) as exc:
            if self.config.outage is None or not is_outage(exc):
                raise
            if self.stop_event.is_set():
                # stopping with a server away: the window being written stays unacked and comes again
                _log.warning("stopped while a server does not answer; the open window was not committed")
                return True
            watch = self.stream_watch if isinstance(exc, StreamError) else self.store_watch
            delay = watch.failed(exc)  # raises exc once the limit passed
            if guard is not None:
                guard.report_lost(self._token, "an outage ended its loop: taking a new version")
            self.restarts += 1
            _log.debug("restarting from the positions stored in the collection: %s", exc)
            while not self.stop_event.wait(delay):
                try:
                    self._ask(watch)
                except (DiffstoreError, StreamError) as again:
                    if not is_outage(again):
                        raise
                    delay = watch.failed(again)
                    continue
                watch.succeeded()
                return False
            return True

    def _ask(self, watch: OutageWatch) -> None:
        """One cheap call to the server that ``watch`` waits for; raises what the call raises."""
        if watch is self.stream_watch:
            self.client.check_reachable(PROBE_CONNECT_S)  # a server still away: said in seconds, not 30
            self.client.describe_cluster()
        else:
            self.sink.collection.generation_state()

    def _run_active(self, on_commit: Callable[[CommitStats], None] | None, guard: LeaseGuard | None) -> None:
        """The loop of an active ingestor; with ``guard`` it returns early once the lease is lost."""
        accumulator = self._accumulator = self.prepare()
        self.store_watch.succeeded()  # both servers answered prepare(): an outage is over
        self.stream_watch.succeeded()
        probe_at, probed_at_stop = 0.0, False
        consumer = StreamSubscriber(
            self.client,
            self.config.subscription_id,
            self.config.consumer,
            watch=None if self.config.outage is None else self.stream_watch,
        )
        writer = ThreadPoolExecutor(1, thread_name_prefix="ingest-writer")
        pending: tuple[Future[tuple[bytes, int]], IngestWindow] | None = None
        try:
            while True:
                if pending is not None and pending[0].done():
                    if not self._finish(pending, accumulator, consumer, on_commit):
                        assert guard is not None
                        guard.report_lost(self._token)
                        return  # the lease moved under the write: nothing of it committed or acked
                    pending = None
                now = time.monotonic()
                if guard is not None and not guard.holds(self._token):
                    if pending is not None:
                        pending[0].exception()  # a commit that made it is acked by _finish above
                        continue
                    return  # stand by: the open window stays unacked and goes to the next consumer
                stopping = self.stop_event.is_set()
                # records held above a frontier: ask the server (never with a commit under way, whose acks
                # are what moves the server's committed position); once more when stopping
                if (
                    pending is None
                    and accumulator.held
                    and (now >= probe_at or stopping and not probed_at_stop)
                ):
                    self._probe(accumulator, now)
                    probe_at = now + PROBE_INTERVAL_S
                    probed_at_stop = stopping
                if pending is None and accumulator.window_count:
                    if stopping or accumulator.ready(now):
                        window = accumulator.take()
                        pending = (writer.submit(self._write_generation, window), window)
                        continue
                if stopping:
                    if pending is not None:
                        pending[0].exception()  # wait for the write; _finish raises its error
                        continue
                    return  # records still held stay unacked: they come again
                deadline = accumulator.deadline()
                if accumulator.held and pending is None:
                    deadline = probe_at if deadline is None else min(deadline, probe_at)
                longest = 0.005 if pending is not None else 0.05
                timeout = longest if deadline is None else min(longest, max(0.0, deadline - now))
                batch = consumer.poll(timeout)
                if batch is None:
                    continue
                disorder = accumulator.disorder
                ack_now = accumulator.offer(batch.records, time.monotonic(), batch.call)
                if accumulator.disorder != disorder:
                    _log.warning(
                        "shard %d: %d record(s) arrived below the applied frontier; applied late",
                        batch.shard_id,
                        accumulator.disorder - disorder,
                    )
                if ack_now:
                    self.skipped_total += len(ack_now)
                    consumer.ack(ack_now)
        finally:
            writer.shutdown(wait=True)
            consumer.close()

    def _finish(
        self,
        pending: tuple[Future[tuple[bytes, int]], IngestWindow],
        accumulator: WindowAccumulator,
        consumer: StreamSubscriber,
        on_commit: Callable[[CommitStats], None] | None,
    ) -> bool:
        """Acks a committed window and reports it; False when the lease was lost (nothing committed)."""
        future, window = pending
        try:
            generation, items = future.result()  # a failed write ends run() with its error
        except (LeaseLost, GenerationMismatch, OutdatedGeneration):
            # With a lease these say that another ingestor took over (its fenced start discarded this
            # window's generation, or moved past it): stand by. Without one they are errors.
            if self._token is None:
                raise
            return False
        self.store_watch.succeeded()
        accumulator.committed(window)
        consumer.ack(window.record_ids)  # only now: the generation and the positions are committed
        if accumulator.held:
            consumer.flush()  # held records wait for these acks to move the server's committed position
        self.applied_total += len(window.records)
        if on_commit is not None:
            now = time.time()
            lag = max(0.0, now - window.newest_publish_ns / 1e9) if window.newest_publish_ns else 0.0
            shard_lag = {
                shard: max(0.0, now - newest / 1e9)
                for shard, newest in window.newest_publish_ns_by_shard.items()
                if newest
            }
            on_commit(
                CommitStats(
                    generation,
                    len(window.records),
                    items,
                    self.applied_total,
                    self.skipped_total,
                    lag,
                    dict(accumulator.positions),
                    shard_lag,
                )
            )
        return True

    def _probe(self, accumulator: WindowAccumulator, now: float) -> None:
        """Tells ``accumulator`` what the server says of the shards whose records it holds: the tail of
        those just delivered on a new call (their mark), and the subscription's committed positions.

        A question the server cannot answer now (the link broke, UNAVAILABLE) is asked again at the next
        probe: the held records wait meanwhile, as the consumer's call reconnects by itself."""
        try:
            for shard_id in accumulator.marks_needed(now):
                tail = self.client.get_tail_record_id(self.stream_name, shard_id)
                accumulator.set_mark(shard_id, tail.position, now)
            if accumulator.held:
                offsets = self.client.get_subscription(self.config.subscription_id).offsets
                accumulator.certify({offset.shardId: offset.batchId for offset in offsets}, now)
        except StreamUnavailable as exc:
            _log.warning("asking the streams server about held records failed, asking again: %s", exc)

    def _add_shards(self, shard_ids: list[int]) -> None:
        """Position readers for shards that appeared after :meth:`prepare` (added to the stream while
        ingesting: a window holds their first records). Created null, like the others at the start: the
        window's commit moves them, so the new shards' records are applied exactly once too."""
        if not shard_ids:
            return
        names = {shard: shard_reader(self.config.subscription_id, shard) for shard in shard_ids}
        target = shard_reader_target(self.stream_name)
        ensure_readers(self.sink.collection, {name: target for name in names.values()})
        self._readers.update(names)

    def _write_generation(self, window: IngestWindow) -> tuple[bytes, int]:
        """One round: start, put_many, commit with the position readers and :func:`window_metadata` (abort on
        failure), in one call when the window fits one chunk."""
        items = map_records(self.mapper, window.records)
        positions = sorted(window.positions.items())
        self._add_shards([shard for shard, _ in positions if shard not in self._readers])
        updates = [(self._readers[shard], pos.to_bytes()) for shard, pos in positions]
        round_ = Round.next(self.sink.collection, lease=self._token)
        metadata = window_metadata(self.config.subscription_id, self.stream_name, window)
        self.sink.write_round(round_, items, updates, metadata)
        return round_.generation_id, len(items)
