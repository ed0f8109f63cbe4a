"""Read replicas: ``diffstore serve --replica-of URL`` follows a primary through its public HTTP API.

:class:`Follower` copies every collection generation by generation, with the primary's generation ids,
records and reader moves, each generation applied in one transaction of the replica's store together
with its position (see :mod:`diffstore.engine.replication`). :func:`check_primary` refuses, in one line,
a URL that is not a diffstore primary. ``docs/replicas.md`` is the user's guide.
"""

from __future__ import annotations

import secrets

from diffstore.client import Client
from diffstore.errors import DiffstoreError, NotReplica, StorageError, Unauthorized
from diffstore.replica._follow import Follower, FollowerConfig
from diffstore.replica._plan import READER_PREFIX, reader_name
from diffstore.tls import CertFiles

__all__ = [
    "READER_PREFIX",
    "Follower",
    "FollowerConfig",
    "Unreachable",
    "check_primary",
    "new_replica_id",
    "reader_name",
]


def new_replica_id() -> str:
    """A fresh replica id (it names the readers the replica holds on its primary)."""
    return secrets.token_hex(6)


class Unreachable(Exception):
    """The primary does not answer now (the replica starts anyway and keeps trying)."""


def check_primary(
    url: str, token: str | None, ca_file: str | None = None, cert: CertFiles | None = None
) -> str | None:
    """Why ``url`` cannot be followed (one line), or None when it is a diffstore primary.

    A primary answers ``GET /replica`` with 409 ``notReplica``; a replica answers it (a replica of a
    replica is refused: follow its primary); anything else is not a diffstore server, or not this token.

    Raises:
        Unreachable: nothing answers at ``url`` now.
    """
    try:
        with Client(url, token=token, timeout_s=10.0, ca_file=ca_file, cert=cert) as client:
            status = client.replica_status()
    except NotReplica:
        return None
    except Unauthorized:
        return (
            f"{url} refused the token: give the primary's token with --replica-token-file F"
            " (or DIFFSTORE_REPLICA_TOKEN)"
        )
    except StorageError as exc:
        if exc.__cause__ is None and ("TLS" in exc.reason or "certificate" in exc.reason):
            return exc.reason  # reached, but the TLS settings are wrong: waiting will not mend them
        raise Unreachable(f"cannot reach {url} ({exc.reason}); following it when it answers") from exc
    except DiffstoreError:
        return f"{url} is not a diffstore server (GET /replica did not answer as one)"
    primary = status.get("primary") if isinstance(status, dict) else None
    if primary is None:
        return f"{url} is not a diffstore server (GET /replica did not answer as one)"
    return f"{url} is itself a replica (of {primary}): point --replica-of at the primary"
