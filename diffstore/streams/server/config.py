"""Configuration of the embedded HStream-compatible server: one frozen dataclass, validated on construction.

Every interval the server waits on lives here so that tests can run the whole protocol in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from diffstore.engine.types import MIN_MAP_SIZE
from diffstore.streams import DEFAULT_PORT as DEFAULT_PORT


@dataclass(frozen=True, slots=True)
class StreamServerConfig:
    """How an embedded stream server listens, stores and paces itself.

    Attributes:
        data_dir: directory of the server's own LMDB environment (created if missing).
        host: interface to bind.
        port: port to bind; 0 picks a free one (the bound port is advertised).
        advertised_host: host that DescribeCluster and the Lookup RPCs return; defaults to ``host``
            (or ``127.0.0.1`` when ``host`` is a wildcard address).
        resend_tick: seconds between two checks of ack deadlines.
        assignment_interval: seconds between two rebalances of shards over a subscription's consumers.
        ack_timeout_unit: seconds that one unit of ``ackTimeoutSeconds`` lasts (1.0 in production;
            tests use milliseconds).
        max_batches_per_poll: new batches one delivery round may read per subscription (fairness).
        map_size: upper bound of the LMDB file in bytes (at least 1 MiB); appends past it answer
            RESOURCE_EXHAUSTED and change nothing.
        sync: fsync every committed LMDB transaction (durability).
        max_batch_records: the largest ``batchSize`` an Append may declare.
        max_batch_bytes: the largest payload of an Append once decompressed (decompression stops past it,
            so a zip bomb costs no more than this).
        redeliver_at_once: a consumer's unacked records are due at once for the next owner of their shard
            when it leaves or a rebalance moves the shard (in order, before newer batches). False: only at
            their ack deadline, as HStreamDB does (the new owner then gets newer batches first; tests use
            it to check that ingestion stays exactly once under that order).
        tls_cert, tls_key: PEM certificate (chain) and private key; when given the server speaks TLS only
            (clients dial ``hstreams://``). Both or neither.
        tls_key_password: the passphrase of an encrypted ``tls_key`` (decrypted in memory with the
            ``openssl`` command: gRPC reads no encrypted key).
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    advertised_host: str | None = None
    resend_tick: float = 0.5
    assignment_interval: float = 1.0
    ack_timeout_unit: float = 1.0
    max_batches_per_poll: int = 256
    map_size: int = 1 << 40
    sync: bool = True
    max_batch_records: int = 1_000_000
    max_batch_bytes: int = 64 << 20
    server_version: str = field(default="0.1.0-diffstore")
    redeliver_at_once: bool = True
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_key_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        for name in ("resend_tick", "assignment_interval", "ack_timeout_unit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not MIN_MAP_SIZE <= self.map_size < 1 << 63:
            raise ValueError(f"map_size must be within {MIN_MAP_SIZE}..2^63-1 bytes")
        if self.max_batch_records < 1 or self.max_batch_bytes < 1:
            raise ValueError("max_batch_records and max_batch_bytes must be at least 1")
        if self.max_batches_per_poll < 1:
            raise ValueError("max_batches_per_poll must be at least 1")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None:
                object.__setattr__(self, name, Path(path))
                if not Path(path).is_file():
                    raise ValueError(f"{name.replace('_', '-')} {path} is not a readable file")

    @property
    def public_host(self) -> str:
        """The host clients are told to dial."""
        if self.advertised_host:
            return self.advertised_host
        if self.host in ("", "0.0.0.0", "::", "[::]"):
            return "127.0.0.1"
        return self.host
