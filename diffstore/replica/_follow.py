"""The follower: one watcher thread and a bounded pool of workers follow every collection of the primary.

The watcher reads the primary's ``GET /overview`` -- every collection with its current generation and its
readers, in one request -- compares it with the replica's store and queues the collections that need work:
not copied yet, behind, deleted on the primary, our hold gone, readers moved outside commits, or an idle
check due (readers and leases; spread so that many collections cost a bounded rate of requests). Then it
long-polls ``GET /overview/changes``, which answers as soon as anything changes on the primary.

``threads`` workers (a fixed number, whatever the number of collections: issue 54) take queued collections,
one worker per collection at a time, and call :meth:`CollectionFollower.sync`. A worker that finds the
queue empty keeps long-polling the collection it just applied for a short while: a collection written
continuously is followed within one round trip, not one overview check.

Never silent (docs/replicas.md, "States"): each collection is ``copying``, ``following`` or ``stalled``
(:mod:`diffstore.replica._status`); a failure backs off (bounded, with jitter); the first failure of a run
and every change of state is one log line, and is stored with the collection's lag (``GET /replica``,
metrics, the console). A promotion (``NotReplica`` from the engine) stops everything, then the old primary
is told to step down at the new term and the replica's holds there are deleted, in every collection of
the primary (copied or not) -- retried until the old primary answers, so one that was away during the
promotion is fenced when it comes back (see :mod:`diffstore.replica.promotion`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from diffstore.client import Client, Collection
from diffstore.client import _calls as calls
from diffstore.client._calls import Call
from diffstore.client._transport import unreachable
from diffstore.engine.store import Store
from diffstore.errors import DiffstoreError, Fenced, NoSuchCollection, NoSuchRoute, NotReplica
from diffstore.replica._collection import CollectionFollower, CopySettings, Dropped, Waiting
from diffstore.replica._plan import READER_PREFIX, reader_name
from diffstore.replica._status import COPYING, FOLLOWING, Backoff, Change, Tracker
from diffstore.tls import CertFiles
from diffstore.wire import Codec

_log = logging.getLogger("diffstore.replica")

BACKLOG_WAIT_S = 1.0  # the longest the watcher holds off its next overview while the workers are busy


@dataclass(frozen=True, slots=True)
class FollowerConfig:
    """How a replica follows its primary.

    Attributes:
        primary: the primary's base URL.
        token: the primary's bearer token, if it has one.
        replica_id: names the readers this replica holds on the primary (stored with the replica's state).
        poll_ms: the longest wait for a change on the primary (the overview's long poll).
        threads: workers that copy and apply (the follower's threads, whatever the number of collections).
        hot_poll_ms: how long a worker with nothing queued keeps long-polling the collection it applied.
        idle_check_s: how often an idle collection's readers and leases are compared at most.
        idle_checks_per_s: the rate of those comparisons at most (many collections: checked less often).
        batch_records: records read ahead before they are applied (bounds the follower's memory; a larger
            generation is read whole, it is applied in one transaction).
        page_records: records per request.
        backoff: the wait after failures (bounded, with jitter).
        ca_file, cert: how an ``https://`` primary is checked and shown a client certificate.
    """

    primary: str
    token: str | None
    replica_id: str
    poll_ms: int = 2_000
    threads: int = 4
    hot_poll_ms: int = 2_000
    idle_check_s: float = 2.0
    idle_checks_per_s: float = 50.0
    batch_records: int = 20_000
    page_records: int = 5_000
    backoff: Backoff = Backoff()
    ca_file: str | None = None
    cert: CertFiles | None = None


@dataclass(frozen=True, slots=True)
class Seen:
    """One collection of the primary's overview: its current generation and whether it holds our hold
    (and the other readers' positions, to see them move outside commits)."""

    generation_id: bytes
    held: bool
    readers: tuple[tuple[str, str, bytes | None], ...]


def _overview(hold: str) -> Call[dict[str, Seen]]:
    def parse(obj: Any, codec: Codec) -> dict[str, Seen]:
        seen: dict[str, Seen] = {}
        for item in obj["collections"]:
            readers = []
            held = False
            for reader in item["readers"]:
                if reader["readerName"] == hold:
                    held = True
                elif not reader["readerName"].startswith(READER_PREFIX):
                    at = reader.get("generationId")
                    position = None if at is None else codec.parse_es(at, "generationId")
                    readers.append((reader["readerName"], reader["target"], position or None))
            generation = codec.parse_es(item["generationId"], "generationId")
            seen[item["name"]] = Seen(generation, held, tuple(sorted(readers)))
        return seen

    return Call("GET", "/overview", parse)


def _overview_changes(since: str | None, timeout_ms: int) -> Call[str]:
    params = {"timeoutMs": str(timeout_ms)} | ({} if since is None else {"since": since})
    return Call(
        "GET", "/overview/changes", lambda obj, codec: str(obj["version"]), params=params,
        timeout_s=timeout_ms / 1000 + 30,
    )  # fmt: skip


class Follower:
    """Follows every collection of ``config.primary`` into ``store`` until :meth:`stop` or a promotion."""

    def __init__(self, store: Store, config: FollowerConfig) -> None:
        self.store = store
        self.config = config
        self.settings = CopySettings(config.replica_id, config.batch_records, config.page_records)
        self.hold = reader_name(config.replica_id)
        self.primary_names: frozenset[str] = frozenset()  # the primary's collections, as last listed
        self.tracker = Tracker(config.backoff)
        self._stopping = threading.Event()
        self._closing = threading.Event()  # the server stops (the promotion's clean-up ends too)
        self._lock = threading.Condition()
        self._queued: collections.deque[str] = collections.deque()
        self._queued_set: set[str] = set()
        self._running: set[str] = set()
        self._again: set[str] = set()  # asked for while running: queued again when it ends
        self._checked: dict[str, float] = {}  # when each collection was last synced (monotonic)
        self._followers: dict[str, CollectionFollower] = {}
        self._client = Client(config.primary, token=config.token, ca_file=config.ca_file, cert=config.cert)
        self._threads: list[threading.Thread] = []
        self._main: threading.Thread | None = None
        self._wake = threading.Event()
        self._watch_failures = 0
        self._unreachable: set[str] = set()  # stalled by the watcher: their recovery is not logged one by one

    # --- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._main = threading.Thread(target=self.run, name="diffstore-replica", daemon=True)
        self._main.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._closing.set()
        self._stopping.set()
        self._wake.set()
        with self._lock:
            self._lock.notify_all()
        if self._main is not None:
            self._main.join(timeout_s)

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    @property
    def thread_count(self) -> int:
        """The follower's live threads (the watcher and the workers)."""
        main = self._main is not None and self._main.is_alive()
        return main + sum(thread.is_alive() for thread in self._threads)

    def run(self) -> None:
        """The watcher (see the module); starts the workers, ends them, lets the holds go on promotion."""
        for number in range(max(1, self.config.threads)):
            thread = threading.Thread(target=self._work, name=f"diffstore-replica-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)
        try:
            self._watch()
        finally:
            self._stopping.set()
            with self._lock:
                self._lock.notify_all()
            for thread in self._threads:
                thread.join(self.config.hot_poll_ms / 1000 + 35)
            if not self.store.read_only():
                self._promoted()  # after the workers: none of them acts on a hold that went away
            self._client.close()

    # --- the watcher --------------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping.is_set():
            try:
                self._watch_until_failure()
                return
            except Exception:  # noqa: BLE001 -- a bug must not end the watcher; logged, then tried again
                _log.exception("replica: unexpected failure of the watcher")
                self._stopping.wait(self.config.backoff.cap_s)

    def _watch_until_failure(self) -> None:
        version: str | None = None
        while not self._stopping.is_set():
            if not self.store.read_only():
                return
            try:
                seen = self._client.execute(_overview(self.hold))
            except DiffstoreError as exc:
                self._watch_failed(exc)
                version = None
                continue
            if self._watch_failures:
                _log.info("replica: the primary answers again (after %d failures)", self._watch_failures)
                self._watch_failures = 0
            self.primary_names = frozenset(seen)
            try:
                self._plan(seen)
            except NotReplica:
                return
            except Exception:  # noqa: BLE001 -- a bug must not end the watcher; logged, then tried again
                _log.exception("replica: unexpected failure while planning")
                self._stopping.wait(self.config.backoff.cap_s)
            try:
                version = self._wait(version)
            except DiffstoreError as exc:
                self._watch_failed(exc)
                version = None
            self._settle()

    def _watch_failed(self, exc: DiffstoreError) -> None:
        self._watch_failures += 1
        if self._watch_failures == 1:
            _log.warning(
                "replica: cannot read the primary's collections: %s (%s); every collection is stalled;"
                " retrying with back-off",
                exc.reason,
                exc.code,
            )
        reason = f"cannot reach the primary: {exc.reason} ({exc.code})"
        try:
            names = set(self.primary_names) | {info.name for info in self.store.collections()}
            for name in sorted(names):
                with self._lock:
                    busy = name in self._running
                if not busy:
                    self._unreachable.add(name)
                    self._report(name, self.tracker.unreachable(name, reason, _now()[0]))
        except NotReplica:
            self._stopping.set()
            return
        self._stopping.wait(self.config.backoff.delay_s(self._watch_failures, self.tracker.rng))

    def _settle(self) -> None:
        """Waits (up to ``BACKLOG_WAIT_S``) while the workers have a backlog: the next overview would only
        queue again what is queued. Without it each hold a first copy places on the primary changes the
        overview, and the watcher reads all of it again: N collections copied cost N overviews of N."""
        deadline = time.monotonic() + BACKLOG_WAIT_S
        with self._lock:
            while len(self._queued) >= max(1, self.config.threads) and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._lock.wait(left)

    def _wait(self, version: str | None) -> str:
        """Waits for a change on the primary, a worker's news or the next retry or idle check due."""
        now = time.monotonic()
        timeout_s = self.config.poll_ms / 1000
        retry = self.tracker.next_retry(now)
        if retry is not None:
            timeout_s = min(timeout_s, retry)
        if self._wake.is_set():
            timeout_s = 0
        self._wake.clear()
        return self._client.execute(_overview_changes(version, max(0, int(timeout_s * 1000))))

    def _plan(self, seen: dict[str, Seen]) -> None:
        """Queues every collection that needs work (see the module)."""
        local: dict[str, bytes] = {}
        for info in self.store.collections():
            try:
                local[info.name] = self.store.collection(info.name).generation_id
            except NoSuchCollection:
                continue  # a worker dropped it meanwhile
        now = time.monotonic()
        names = set(seen) | set(local)
        # idle checks spread out: many collections are each checked less often
        idle_every = max(self.config.idle_check_s, len(names) / max(self.config.idle_checks_per_s, 0.1))
        for name in sorted(names):
            if not self.tracker.due(name, now):
                continue
            primary, mine = seen.get(name), local.get(name)
            if primary is None or mine is None or primary.generation_id != mine or not primary.held:
                self._queue(name)
            elif self._readers_moved(name, primary) or now - self._checked.get(name, 0.0) >= idle_every:
                self._queue(name)
        for name in list(self.tracker.statuses):  # a copy: workers add statuses meanwhile
            if name not in names:
                self.tracker.forget(name)

    def _readers_moved(self, name: str, seen: Seen) -> bool:
        try:
            mine = self.store.collection(name).readers()
        except DiffstoreError:
            return True
        local = tuple(sorted((r.name, r.collection, r.generation_id or None) for r in mine))
        return local != seen.readers

    def _queue(self, name: str) -> None:
        with self._lock:
            if name in self._running:
                self._again.add(name)
            elif name not in self._queued_set:
                self._queued.append(name)
                self._queued_set.add(name)
                self._lock.notify()

    # --- the workers --------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._stopping.is_set():
                    self._lock.wait()
                if self._stopping.is_set():
                    return
                name = self._queued.popleft()
                self._queued_set.discard(name)
                self._running.add(name)
                self._lock.notify_all()  # the watcher waits for the backlog to drain (_settle)
            try:
                self._follow(name)
            except NotReplica:
                self._stopping.set()  # promoted: the watcher lets the primary's holds go
                self._wake.set()
            except Exception:  # noqa: BLE001 -- a bug must not end the worker; it is logged and retried
                _log.exception("replica: %s: unexpected failure", name)
                self._report(name, self.tracker.failed(name, "unexpected failure (see the log)", *_now()))
            finally:
                with self._lock:
                    self._running.discard(name)
                    if name in self._again:
                        self._again.discard(name)
                        self._queued.append(name)
                        self._queued_set.add(name)
                        self._lock.notify()

    def _follower(self, name: str) -> CollectionFollower:
        follower = self._followers.get(name)
        if follower is None:
            follower = CollectionFollower(self.store, self._client, name, self.settings, self._names)
            self._followers[name] = follower
        return follower

    def _names(self) -> frozenset[str]:
        return self.primary_names

    def _follow(self, name: str) -> None:
        """Syncs one collection; then, while nothing else waits, follows it closely for a while."""
        follower = self._follower(name)
        copied = follower.position() is not None
        if not copied:
            self._report(name, self.tracker.ok(name, COPYING, _now()[0]), quiet_if_new=True)
        told: bytes | None = None  # the primary's current generation, as the last long poll answered it
        while not self._stopping.is_set():
            try:
                position = follower.sync(idle_check=True, told=told)
            except Dropped as exc:
                self._report(name, self.tracker.ok(name, COPYING, _now()[0], f" again: {exc}"))
                with self._lock:
                    self._again.add(name)  # at once, by itself
                return
            except Waiting as exc:
                self._report(name, self.tracker.failed(name, str(exc), *_now()))
                self._wake.set()
                return
            except NotReplica:
                raise
            except DiffstoreError as exc:
                # the link failed, not the collection: said as the watcher says it of every collection
                away = "cannot reach the primary: " if unreachable(exc) else ""
                self._report(name, self.tracker.failed(name, f"{away}{exc.reason} ({exc.code})", *_now()))
                self._wake.set()
                return
            self._checked[name] = time.monotonic()
            if position is None:  # deleted on both sides
                self._followers.pop(name, None)
                self._checked.pop(name, None)
                self.tracker.forget(name)
                self.store.forget_replica_collection(name)
                return
            detail = f" from generation {_text(position)}" if not copied else ""
            self._report(name, self.tracker.ok(name, FOLLOWING, _now()[0], detail))
            copied = True
            with self._lock:
                if self._queued or self._stopping.is_set():
                    return
            try:
                told = follower.wait_change(position, self.config.hot_poll_ms)
            except DiffstoreError:
                return  # the watcher's next look decides
            if told == position:
                return

    def _report(self, name: str, change: Change, quiet_if_new: bool = False) -> None:
        """Stores a change of state and logs its one line."""
        if not change.changed:
            return
        quiet = quiet_if_new and self.tracker.get(name).failures == 0
        if change.state != "stalled" and name in self._unreachable:
            self._unreachable.discard(name)
            quiet = True  # the watcher logged the outage and its end once for all
        if change.line and not quiet:
            level = logging.WARNING if change.state == "stalled" else logging.INFO
            _log.log(level, "%s", change.line)
        try:
            stored = self.store.replica_status(name)
            if stored is not None and (stored.state, stored.reason) == (change.state, change.reason):
                return  # stored already (a first copy stores "following" in its own transaction)
            self.store.set_replica_status(name, change.state, change.reason, change.since_ms)
        except NotReplica:
            raise
        except DiffstoreError:  # pragma: no cover -- the store refuses only on a full disk
            _log.warning("replica: %s: cannot store its state", name)

    # --- promotion ----------------------------------------------------------------------------------------

    def _promoted(self) -> None:
        """Tells the old primary to step down and lets go of the holds there, in every collection of
        either side; retried (backing off to 5 s) until done, a newer primary shows up, or the server
        stops."""
        wait_s = 0.5
        told_failure = False
        while not self._closing.is_set():
            try:
                self._step_down_old_primary()
                return
            except Fenced as exc:
                _log.error("replica: the old primary knows a newer primary than this one: %s", exc.reason)
                return
            except DiffstoreError as exc:
                if not told_failure:
                    _log.warning(
                        "replica: promoted; the old primary %s does not answer (%s): telling it to step down"
                        " and deleting the holds there as soon as it does",
                        self.config.primary,
                        exc.reason,
                    )
                    told_failure = True
            self._closing.wait(wait_s)
            wait_s = min(5.0, wait_s * 2)

    def _step_down_old_primary(self) -> None:
        client = self._client
        state = self.store.replica_state()
        if state.address is not None:
            try:
                client.execute(calls.step_down(state.term, state.address, self.config.replica_id))
            except NoSuchRoute:
                pass  # a server from before terms: nothing to tell
        names = {info.name for info in client.collections()} | {
            info.name for info in self.store.collections()
        }
        for name in sorted(names):
            try:
                Collection(client, name, True).delete_reader(self.hold)
            except NoSuchCollection:
                pass
        _log.info("replica: promoted at term %d; the old primary %s let go", state.term, self.config.primary)


def _now() -> tuple[int, float]:
    return time.time_ns() // 1_000_000, time.monotonic()


def _text(generation_id: bytes) -> str:
    from diffstore.errors import text_form

    return text_form(generation_id)
