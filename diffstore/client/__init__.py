"""The Python client of a diffstore (or diffbelt) HTTP server, sync and async, on httpx.

    from diffstore.client import Client
    with Client("http://127.0.0.1:3030") as client:
        orders = client.collection("orders")
        for item in orders.diff(from_reader="indexer"):
            ...

Handles mirror the engine's ``Collection`` (same method names and results); errors are the engine's
exception classes. The request/response logic is written once (pure calls and plans) and driven by a
blocking or an asyncio transport.
"""

from diffstore.client._async import AsyncClient, AsyncCollection
from diffstore.client._calls import Call
from diffstore.client._columns import DiffColumns, GetManyColumns, QueryColumns
from diffstore.client._sync import Client, Collection
from diffstore.client._transport import DEFAULT_URL, WireFormat, unreachable

__all__ = [
    "AsyncClient",
    "AsyncCollection",
    "Call",
    "Client",
    "Collection",
    "DEFAULT_URL",
    "DiffColumns",
    "GetManyColumns",
    "QueryColumns",
    "WireFormat",
    "unreachable",
]
