"""The one configuration of the HTTP server; passed down, never global."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from diffstore.engine.types import RetentionPolicy
from diffstore.errors import InvalidRequest
from diffstore.tls import CertFiles

MAX_KEY_BYTES = (1 << 24) - 1  # SPEC §1: the largest key
# What the largest key takes in a body: as base64 text in JSON (msgpack carries it raw, in less)
KEY_ALLOWANCE_BYTES = 4 * -(-MAX_KEY_BYTES // 3)


class Limit(enum.Enum):
    """Which body limit of SPEC §1 a route enforces."""

    CREATE_COLLECTION = "create_collection"
    PUT = "put"
    PUT_MANY = "put_many"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``diffstore serve`` and :func:`~diffstore.server.create_app` can be tuned with.

    Attributes:
        data_dir: the store's directory (used by the ``serve`` command; the app gets an open store).
        host, port: where ``serve`` listens; loopback by default.
        token: when set, every route but ``/healthz`` requires ``Authorization: Bearer <token>``: one token of
            scope ``admin`` (named ``token`` in the audit trail).
        token_file: the file of scoped tokens (``NAME SECRET SCOPE [COLLECTIONS-GLOB]`` lines, see
            :mod:`diffstore.server.scopes`), re-read when it changes and on SIGHUP; with ``token`` too,
            both are accepted.
        token_poll_s: how often the token file is looked at for a change.
        commit_delay_ms: passed to the store (auto-commit delay of non-manual collections).
        sync: passed to the store: flush every commit to disk before answering (see ``StoreConfig.sync``).
        map_size: passed to the store: upper bound of its file in bytes (see ``StoreConfig.map_size``).
        create_collection_max_bytes: the body limit of collection creation (413 beyond it).
        put_max_bytes, put_many_max_bytes, body_max_bytes: the body limits of put, putMany and every other
            route, each *plus* :data:`KEY_ALLOWANCE_BYTES` (SPEC §1: a key that can be written can always
            be read, looked around, and used as ``fromKey``/``toKey``).
        inflight_body_max_bytes: the request body bytes all requests together may hold at once (bytes
            received, not declared); past it a request is answered 503 ``overloaded`` with ``Retry-After``
            (a request alone is always let in).
        inflight_connection_max_bytes: ... and what one request may hold of it while others hold some too
            (so that a few connections cannot take it all; the default lets every putMany of SPEC §1 in).
        large_body_bytes: a body larger than this is parsed and applied while no other such body is: it
            would wait for the store's write lock anyway, and waiting parsed it holds several times its size
            (three 1M-item putManys at once peaked at 1.7 GiB RSS, see ``benchmarks/put_many_memory.py``).
        backup_max_concurrent: how many ``GET /backup`` streams every process of the data directory together
            may run at once (each is a copy process and holds one of LMDB's reader slots); past it: 503
            ``overloaded`` with ``Retry-After``.
        backup_stall_timeout_s, backup_stall_min_bytes: a backup stream that sent fewer than
            ``backup_stall_min_bytes`` in the last ``backup_stall_timeout_s`` seconds is ended by the server
            (its copy stops and lets go of the pages it pins; the client sees the body cut off); 0: never.
        long_poll_default_ms, long_poll_max_ms: ``timeoutMs`` of ``generationId/stream``.
        shutdown_timeout_s: how long a graceful shutdown waits for open requests.
        access_log: log every request (off by default: it costs throughput).
        workers: how many server processes ``serve`` runs over the data directory (1: one process);
            see ``docs/process-model.md``.
        worker_timeout_s: with workers, a worker whose event loop has not answered its supervisor this
            long (a stopped or hung process) is killed and replaced (0: never).
        header_timeout_s: a connection whose request line and headers are not all read this long after
            they began (or after it opened) is closed (0: never).
        body_timeout_s: ... and one whose body stalls this long between two chunks (0: never; this also
            turns off the minimum rate).
        body_min_rate_bytes_s: ... and one whose body has not arrived within ``body_timeout_s`` plus one
            second per this many bytes received (0: no minimum rate): the bytes a slow body holds in the
            in-flight budget are held for a bounded time.
        metrics: count and time every request for ``/metrics`` (about 5-20 us per request, see
            ``benchmarks/metrics_overhead.py``); without it ``/metrics`` still shows engine events.
        log_level, log_format: logging of the server's processes (see :mod:`diffstore.logs`).
        replica_of: the primary's URL when the server is a read replica (``docs/replicas.md``).
        replica_token: the primary's bearer token.
        default_retention: passed to the store: the retention policy of collections created without one
            (see ``StoreConfig.default_retention``).
        tls_cert, tls_key: PEM certificate and key: every worker serves HTTPS only (none: plain HTTP).
        tls_client_ca: PEM authority whose client certificates a TLS connection must show (none: not asked).
        tls_key_password: the passphrase of an encrypted ``tls_key``.
        replica_ca_file, replica_cert: how the replica link checks an ``https://`` primary and proves itself.
        ha_etcd: etcd's client URLs when the server is a member of a fail-over cluster (``docs/failover.md``);
            empty: it is not.
        ha_cluster, ha_member, ha_advertise: the cluster's name, this member's, the URL others reach it at.
        ha_ttl_s: the leader key's lease (a leader that cannot renew it stops writes after half of it).
        synchronous: a write (a manual collection's commit, an automatic collection's put or putMany) is
            acknowledged only once this many replicas applied its generation (0: at once; see
            ``docs/replicas.md``, "Synchronous replication", and :mod:`diffstore.server.synchronous`).
        synchronous_timeout_s: how long such a write waits for them before it answers 503 ``notReplicated``
            (committed here all the same); 0: for ever.
    """

    data_dir: str = "./data"
    host: str = "127.0.0.1"
    port: int = 3030
    token: str | None = None
    token_file: str | None = None
    token_poll_s: float = 1.0
    commit_delay_ms: int = 50
    sync: bool = True
    map_size: int = 1 << 40
    create_collection_max_bytes: int = 4 * 1024
    put_max_bytes: int = 4 * 1024 * 1024
    put_many_max_bytes: int = 32 * 1024 * 1024
    body_max_bytes: int = 64 * 1024
    inflight_body_max_bytes: int = 128 * 1024 * 1024
    inflight_connection_max_bytes: int = 32 * 1024 * 1024
    large_body_bytes: int = 1024 * 1024
    backup_max_concurrent: int = 2
    backup_stall_timeout_s: float = 60.0
    backup_stall_min_bytes: int = 1024 * 1024
    long_poll_default_ms: int = 60_000
    long_poll_max_ms: int = 300_000
    shutdown_timeout_s: float = 10.0
    access_log: bool = False
    workers: int = 1
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    body_min_rate_bytes_s: int = 64 * 1024
    worker_timeout_s: float = 10.0
    metrics: bool = True
    log_level: str = "info"
    log_format: str = "text"
    replica_of: str | None = None
    replica_token: str | None = None
    default_retention: RetentionPolicy | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tls_key_password: str | None = field(default=None, repr=False)
    replica_ca_file: str | None = None
    replica_cert: CertFiles | None = field(default=None, repr=False)  # a key's passphrase may be third
    ha_etcd: tuple[str, ...] = ()
    ha_cluster: str | None = None
    ha_member: str | None = None
    ha_advertise: str | None = None
    ha_ttl_s: int = 10
    synchronous: int = 0
    synchronous_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 64:
            raise InvalidRequest("workers must be within 1..64")
        if self.header_timeout_s < 0 or self.body_timeout_s < 0 or self.worker_timeout_s < 0:
            raise InvalidRequest("timeouts must be >= 0")
        if not 0 <= self.port <= 65535:
            raise InvalidRequest("port must be within 0..65535")
        if self.token is not None and not self.token.strip():
            raise InvalidRequest("token must not be empty (leave it unset for no authentication)")
        if self.token_poll_s <= 0:
            raise InvalidRequest("token_poll_s must be > 0")
        if self.inflight_body_max_bytes < 1 or self.inflight_connection_max_bytes < 1:
            raise InvalidRequest("inflight_body_max_bytes and inflight_connection_max_bytes must be >= 1")
        if self.backup_max_concurrent < 1:
            raise InvalidRequest("backup_max_concurrent must be >= 1")
        if self.backup_stall_timeout_s < 0 or self.backup_stall_min_bytes < 1:
            raise InvalidRequest("backup_stall_timeout_s must be >= 0 and backup_stall_min_bytes >= 1")
        if self.body_min_rate_bytes_s < 0:
            raise InvalidRequest("body_min_rate_bytes_s must be >= 0")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidRequest("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidRequest("--tls-client-ca needs --tls-cert and --tls-key")
        if self.ha_etcd and (self.ha_cluster is None or self.ha_member is None or self.ha_advertise is None):
            raise InvalidRequest("a fail-over member needs its cluster, its name and its advertised URL")
        if not 0 <= self.synchronous <= 64:
            raise InvalidRequest("synchronous must be within 0..64 (replicas to wait for)")
        if not 0 <= self.synchronous_timeout_s <= 86_400:
            raise InvalidRequest("synchronous_timeout_s must be within 0..86400 (0: wait for ever)")
        if not 0 <= self.long_poll_default_ms <= self.long_poll_max_ms:
            raise InvalidRequest("long_poll_default_ms must be within 0..long_poll_max_ms")

    def limit(self, kind: Limit) -> int:
        """The body limit in bytes of one kind of route (the room for the largest key included)."""
        room: int = getattr(self, _LIMIT_FIELDS[kind])
        return room if kind is Limit.CREATE_COLLECTION else room + KEY_ALLOWANCE_BYTES


_LIMIT_FIELDS = {
    Limit.CREATE_COLLECTION: "create_collection_max_bytes",
    Limit.PUT: "put_max_bytes",
    Limit.PUT_MANY: "put_many_max_bytes",
    Limit.OTHER: "body_max_bytes",
}
