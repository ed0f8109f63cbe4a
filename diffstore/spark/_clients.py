"""One :class:`diffstore.client.Client` per server and codec in each Spark Python worker process.

Spark reuses its Python workers (``spark.python.worker.reuse``) across tasks, so a client kept for the
process keeps its pooled keep-alive connections too: a task does not pay a new httpx client (an SSL
context is built even for plain HTTP) and new TCP connections. The client is thread-safe, so a task's
prefetch thread shares it. Clients live as long as the process; drivers that want a private client
build their own and close it.
"""

from __future__ import annotations

import threading

from diffstore.client import Client, WireFormat
from diffstore.spark.options import Connection
from diffstore.tls import ShippedTls

# Bulk pages of 10,000 items on a loaded 2-core machine can take seconds: be generous.
TIMEOUT_S = 120.0

_clients: dict[tuple[str, str, str | None, ShippedTls | None], Client] = {}
_lock = threading.Lock()


def shared_client(url: str, codec: str, token: str | None = None, tls: ShippedTls | None = None) -> Client:
    """The process's client of ``url`` speaking ``codec`` (``msgpack`` or ``json``), sending ``token``
    as a bearer token when given, checking an ``https://`` server and showing a client certificate with
    ``tls``'s files."""
    key = (url, codec, token, tls)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = new_client(url, codec, token, tls)
        return client


def new_client(url: str, codec: str, token: str | None = None, tls: ShippedTls | None = None) -> Client:
    """A private client (the caller closes it)."""
    wire: WireFormat = "json" if codec == "json" else "msgpack"
    if tls is None:
        return Client(url, token=token, format=wire, timeout_s=TIMEOUT_S)
    with tls.files() as files:  # loaded into the client's SSL context here: the files go at once
        return Client(url, token=token, format=wire, timeout_s=TIMEOUT_S, **files.client_kwargs())


def shared_for(connection: Connection) -> Client:
    """:func:`shared_client` of a data source's connection."""
    return shared_client(connection.url, connection.codec, connection.token, connection.tls)


def new_for(connection: Connection) -> Client:
    """:func:`new_client` of a data source's connection (the caller closes it)."""
    return new_client(connection.url, connection.codec, connection.token, connection.tls)
