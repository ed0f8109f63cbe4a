"""A fail-over member: the election (:mod:`diffstore.ha.election`) wired to etcd and to the store.

One thread observes the cluster's keys in etcd every ``interval_s``, keeps the member's lease alive,
feeds the election what it saw and carries out what it decides:

- **lead**: the store becomes the primary at the new term (``Store.ha_lead``; a follower stops);
- **follow**: the store becomes a replica of the leader (``Store.ha_follow``) and a
  :class:`~diffstore.replica.Follower` copies from it. First the member compares, collection by
  collection, its generations with the leader's digests: where its current generation is one the leader
  has with the same digest it places its hold there and the follower carries on from it; otherwise the
  generations above the newest one they share are the writes the leader never saw -- they are counted
  (log line, ``diffstore_ha_discarded_generations_total``) and the follower copies the collection again;
- **step back**: the lease was not renewed in time or the key is gone: writes are refused at once.

Every decision is stored with the write deadline (``engine.ha_state``), which every writer checks in its
own transaction: writes stop at the deadline even if this thread is late.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from diffstore.client import Client, Collection
from diffstore.engine.ha_state import HaRecord
from diffstore.engine.store import Store
from diffstore.errors import (
    DiffstoreError,
    GenerationCollected,
    InvalidRequest,
    NoSuchCollection,
    NoSuchGeneration,
    NoSuchReader,
)
from diffstore.ha import election as el
from diffstore.ha.etcd import Etcd, EtcdUnavailable, LeaseNotFound
from diffstore.replica import Follower, FollowerConfig, reader_name
from diffstore.tls import CertFiles

if TYPE_CHECKING:
    from diffstore.server.config import ServerConfig

_log = logging.getLogger("diffstore.ha")


@contextlib.contextmanager
def running_member(store: Store, config: ServerConfig) -> Iterator[Member]:
    """Runs ``store``'s fail-over member (``config.ha_*``) while the server serves."""
    assert config.ha_cluster and config.ha_member and config.ha_advertise
    member = Member(
        store,
        MemberConfig(
            config.ha_etcd,
            config.ha_cluster,
            config.ha_member,
            config.ha_advertise,
            config.ha_ttl_s,
            config.replica_token or config.token,
            config.replica_ca_file,
            config.replica_cert,
        ),
    )
    member.start()
    _log.info(
        "ha: %s joins cluster %s (etcd %s, ttl %d s)",
        config.ha_member,
        config.ha_cluster,
        ",".join(config.ha_etcd),
        config.ha_ttl_s,
    )
    try:
        yield member
    finally:
        member.stop()


@dataclass(frozen=True, slots=True)
class MemberConfig:
    """What a member needs: etcd's endpoints, its cluster's and its own names, the URL the others reach
    it at, the lease's TTL, and how it reaches the leader (token, TLS)."""

    etcd: tuple[str, ...]
    cluster: str
    member: str
    url: str
    ttl_s: int = 10
    token: str | None = None
    ca_file: str | None = None
    cert: CertFiles | None = field(default=None, repr=False)  # a key's passphrase may be third

    @property
    def interval_s(self) -> float:
        return min(0.25, self.ttl_s / 8)

    @property
    def replica_id(self) -> str:
        return f"ha-{self.member}"


class Member:
    """One member of a fail-over cluster over an open store (see the module); :meth:`start`, :meth:`stop`."""

    def __init__(self, store: Store, config: MemberConfig) -> None:
        self.store = store
        self.config = config
        self.etcd = Etcd(list(config.etcd), timeout_s=min(1.0, config.ttl_s / 4))
        prefix = f"/diffstore/ha/{config.cluster}/".encode()
        self.prefix = prefix
        self.leader_key = prefix + b"leader"
        self.term_key = prefix + b"term"
        self.members_prefix = prefix + b"members/"
        self.election = el.Election(config.member, config.url, config.ttl_s, store.replication_term())
        old = store.ha_record()
        self.record = HaRecord(
            config.cluster,
            config.member,
            "candidate",
            term=self.election.term,
            failovers=old.failovers if old else 0,
            discarded=old.discarded if old else 0,
        )
        self.failovers_before = self.record.failovers
        self.lease = 0
        self.term_revision = 0
        self.published: str | None = None
        self.pending: el.LeaderKey | None = None  # a leader to follow, once its digests could be compared
        self.follower: Follower | None = None
        self.etcd_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- life cycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.store.ha_publish(self.record)  # a member refuses writes until it leads
        self._thread = threading.Thread(target=self._run, name="diffstore-ha", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the member; a leader lets its lease go, so that another member takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._stop_follower(join=True)
        if self.election.role == "leader":
            self._set(role="fenced")
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdUnavailable:
                pass
        self.etcd.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 -- a bug must not end the member; logged, then tried again
                _log.exception("ha: unexpected failure of the member")
            self._stop.wait(self.config.interval_s)

    def step(self) -> None:
        """One round: the clock, an observation of etcd, the positions, a pending follow."""
        self._feed(el.Tick(time.monotonic()))
        try:
            seen = self._observe()
        except EtcdUnavailable as exc:
            if not self.etcd_down:
                _log.warning("ha: %s: cannot reach etcd (%s)", self.config.member, exc)
                self.etcd_down = True
            return
        if self.etcd_down:
            _log.info("ha: %s: etcd answers again", self.config.member)
            self.etcd_down = False
        self._feed(seen)
        try:
            self._publish_member(seen.mine)
        except LeaseNotFound:
            self._feed(el.LeaseExpired(time.monotonic()))
        except EtcdUnavailable:
            pass  # published at the next round
        if self.pending is not None:
            self._follow(self.pending)

    # --- the machine's loop ---------------------------------------------------------------------------

    def _feed(self, event: el.Event) -> None:
        queue: deque[el.Event] = deque([event])
        while queue:
            for action in self.election.handle(queue.popleft()):
                try:
                    found = self._act(action)
                except LeaseNotFound:
                    found = [el.LeaseExpired(time.monotonic())]
                except EtcdUnavailable as exc:
                    if not self.etcd_down:  # one line an outage
                        _log.warning("ha: %s: etcd failed during %s (%s)", self.config.member, action, exc)
                        self.etcd_down = True
                    continue
                queue.extend(found)

    def _act(self, action: el.Action) -> list[el.Event]:
        if isinstance(action, el.Renew):
            sent = time.monotonic()
            return [el.Renewed(sent) if self.etcd.keepalive(self.lease) else el.LeaseExpired(sent)]
        if isinstance(action, el.NewLease):
            sent = time.monotonic()
            self.lease = self.etcd.grant(self.config.ttl_s)
            self.published = None
            return [el.Renewed(sent)]
        if isinstance(action, el.Campaign):
            return self._campaign(action.term)
        if isinstance(action, el.Lead):
            self._lead(action.term)
        elif isinstance(action, el.StepBack):
            _log.warning("ha: %s stops accepting writes: %s", self.config.member, action.why)
            self._set(role="fenced")
        elif isinstance(action, el.Follow):
            self._set(role="replica", leader=action.leader)
            self.pending = action.leader
        elif isinstance(action, el.Publish):
            self._set(role=self.election.role)
        return []

    def _observe(self) -> el.Observed:
        leader: el.LeaderKey | None = None
        term = 0
        self.term_revision = 0
        peers: list[el.Peer] = []
        for kv in self.etcd.range_prefix(self.prefix):
            if kv.key == self.leader_key:
                value = json.loads(kv.value)
                ours = self.lease != 0 and kv.lease == self.lease
                leader = el.LeaderKey(value["member"], value["url"], int(value["term"]), ours)
            elif kv.key == self.term_key:
                term, self.term_revision = int(kv.value), kv.mod_revision
            elif kv.key.startswith(self.members_prefix):
                value = json.loads(kv.value)
                peers.append(
                    el.Peer(kv.key[len(self.members_prefix) :].decode(), value["url"], value["positions"])
                )
        mine = self._positions()
        return el.Observed(time.monotonic(), leader, term, tuple(peers), mine)

    def _positions(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for info in self.store.collections():
            try:
                found[info.name] = self.store.collection(info.name).generation_id.hex()
            except NoSuchCollection:
                continue  # deleted meanwhile
        return found

    def _publish_member(self, positions: el.Positions) -> None:
        value = json.dumps({"url": self.config.url, "positions": dict(positions)}, sort_keys=True)
        if value != self.published and self.lease:
            self.etcd.put(self.members_prefix + self.config.member.encode(), value.encode(), self.lease)
            self.published = value

    def _campaign(self, term: int) -> list[el.Event]:
        sent = time.monotonic()
        if not self.etcd.keepalive(self.lease):
            return [el.LeaseExpired(sent)]
        value = json.dumps({"member": self.config.member, "url": self.config.url, "term": term}).encode()
        won = self.etcd.create_both(
            self.leader_key, value, self.lease, self.term_key, self.term_revision, str(term).encode()
        )
        now = time.monotonic()
        return [el.Renewed(sent), el.Won(now, term) if won else el.Lost(now)]

    # --- the store ------------------------------------------------------------------------------------

    def _set(self, role: str, leader: el.LeaderKey | None = None, store: bool = True) -> None:
        """Stores the member's role (and the leader it knows) with the write deadline."""
        known = leader or self.election.leader
        if role != "leader" and known is not None and known.member == self.config.member:
            known = None  # a leader that stepped back knows of no other leader yet
        until = self.election.writable_until if role == "leader" else 0.0
        self.record = replace(
            self.record,
            role=role,
            leader_member=known.member if known else None,
            leader_url=known.url if known else None,
            term=self.election.term,
            writable_until_ns=int(until * 1e9),
            failovers=self.failovers_before + self.election.failovers,
        )
        if store:
            self.store.ha_publish(self.record)

    def _lead(self, term: int) -> None:
        self.pending = None
        self._stop_follower(join=False)  # a late apply of its is refused once the store is promoted
        self._set(role="leader", leader=el.LeaderKey(self.config.member, self.config.url, term), store=False)
        self.store.ha_lead(self.record)
        _log.warning("ha: %s leads cluster %s at term %d", self.config.member, self.config.cluster, term)

    def _stop_follower(self, join: bool) -> None:
        follower, self.follower = self.follower, None
        if follower is None:
            return
        if join:
            follower.stop()
        else:
            threading.Thread(target=follower.stop, name="diffstore-ha-unfollow", daemon=True).start()

    def _follow(self, leader: el.LeaderKey) -> None:
        """Compares the store with ``leader`` (see the module) and follows it; tried again on failure."""
        self._stop_follower(join=True)
        try:
            discarded = self._reconcile(leader.url)
        except DiffstoreError as exc:
            _log.info(
                "ha: %s cannot compare with the leader %s yet (%s)", self.config.member, leader.url, exc
            )
            return
        if self.pending != leader:
            return
        self.pending = None
        if discarded:
            _log.warning(
                "ha: %s discarded %d generation(s) of its own that the leader %s never saw",
                self.config.member,
                discarded,
                leader.member,
            )
            self.record = replace(self.record, discarded=self.record.discarded + discarded)
        self.store.ha_follow(self.record, self.config.replica_id)
        self.follower = Follower(
            self.store,
            FollowerConfig(
                leader.url,
                self.config.token,
                self.config.replica_id,
                ca_file=self.config.ca_file,
                cert=self.config.cert,
            ),
        )
        self.follower.start()
        _log.info(
            "ha: %s follows %s (%s) at term %d", self.config.member, leader.member, leader.url, leader.term
        )

    def _reconcile(self, url: str) -> int:
        """Places this member's holds on the leader where their histories agree; returns how many of its
        generations the leader does not have (they are copied again)."""
        hold = reader_name(self.config.replica_id)
        discarded = 0
        with Client(
            url, token=self.config.token, timeout_s=5.0, ca_file=self.config.ca_file, cert=self.config.cert
        ) as client:
            for info in self.store.collections():
                local, _ = self.store.collection(info.name).digests(limit=1000)
                remote = Collection(client, info.name, True)
                try:
                    theirs = [remote.digest(local[0].generation_id)] if local else []
                except NoSuchCollection:
                    continue  # deleted on the leader: the follower deletes it
                except (NoSuchGeneration, GenerationCollected, InvalidRequest):
                    theirs = []  # not there (or not committed there): compare the newest ones
                if not theirs or theirs[0].digest != local[0].digest:
                    # the leader's newest generations, down to ours (a member far behind is not diverged)
                    newest, _ = remote.digests(before=_after(local[0].generation_id), limit=1000)
                    theirs += newest
                known = {d.generation_id: d.digest for d in theirs if d.digest is not None}
                above = next(
                    (
                        n
                        for n, d in enumerate(local)
                        if d.digest is not None and known.get(d.generation_id) == d.digest
                    ),
                    len(local),
                )
                try:
                    remote.delete_reader(hold)
                except NoSuchReader:
                    pass
                if above == 0 and local:
                    try:
                        remote.create_reader(hold, generation_id=local[0].generation_id)
                    except (GenerationCollected, NoSuchGeneration):
                        pass  # the same history, collected there since: the follower copies it again
                else:
                    discarded += above
        return discarded


def _after(generation_id: bytes) -> bytes:
    """The smallest generation id above ``generation_id`` (bytewise: the id with a zero byte appended)."""
    return generation_id + b"\0"
