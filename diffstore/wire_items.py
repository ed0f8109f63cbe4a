"""The items of put and putMany bodies: validated one by one, or (a large body's hot loop) taken whole.

A putMany body of 10k items is the server's largest input. :func:`decode_put_many` and :func:`parse_items`
turn it into the ``(key, value)`` pairs the engine stores fastest when every item has its codec's common
shape, and fall back to the validating :func:`parse_item`, which reports the first bad item.
"""

from __future__ import annotations

from typing import Any

import msgpack

from diffstore.engine.types import PutItem
from diffstore.errors import InvalidJson, InvalidRequest
from diffstore.wire import Body, Codec, Fields

FlaggedItem = tuple[bytes, bytes | None, bool]


def parse_item(obj: Any, codec: Codec, where: str) -> FlaggedItem:
    """One item of a put or putMany body, validated (``where`` names it in the error)."""
    f = Fields(obj, codec, where)
    if "value" not in f.obj:
        raise InvalidRequest(f"{where}.value: missing (use null for a tombstone)")
    return f.es("key"), f.es_opt("value"), f.flag("ifNotPresent", False)


def _pair_or_map(pairs: list[tuple[Any, Any]]) -> Any:
    """The ``object_pairs_hook`` of :func:`decode_put_many`: ``{"key": bin, "value": bin | nil}`` becomes
    the pair ``(key, value)`` itself, any other map a dict."""
    if len(pairs) == 2:
        (name, key), (other, value) = pairs
        if name == "value" and other == "key":
            name, key, other, value = other, value, name, key
        if (
            name == "key"
            and other == "value"
            and type(key) is bytes
            and (value is None or type(value) is bytes)
        ):
            return (key, value)
    return dict(pairs)


def decode_put_many(raw: bytes, codec: Codec) -> Any:
    """A putMany body, decoded so that its items cost as little memory as they can.

    msgpack items of the common shape are decoded straight into ``(key, value)`` pairs -- what the engine
    takes -- instead of a dict per item that is then copied into a pair: a 1M-item body peaked at 145 MiB
    of Python objects instead of 329 MiB, and decodes no slower (``benchmarks/put_many_memory.py``).
    Lists never decode to tuples, so a tuple in the result is always such an item.

    Raises:
        InvalidJson: the body does not parse.
    """
    if not codec.binary:
        return codec.loads(raw)
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False, object_pairs_hook=_pair_or_map)
    except Exception as exc:  # msgpack raises a zoo of exception types for bad input
        raise InvalidJson(f"malformed {codec.name} body: {exc}") from exc


def _msgpack_items_fast(raw: list[Any]) -> list[PutItem] | None:
    """``(key, value)`` pairs if every item is ``{"key": bin, "value": bin | nil}``; None: not that shape.

    Items that :func:`decode_put_many` made pairs already are taken as they are (no copy of the list).
    """
    if all(type(item) is tuple for item in raw):
        return raw
    items: list[PutItem] = []
    append = items.append
    try:
        for item in raw:
            key = item["key"]
            value = item["value"]
            if len(item) != 2 or type(key) is not bytes or (value is not None and type(value) is not bytes):
                return None
            append((key, value))
    except (KeyError, TypeError):
        return None
    return items


def _json_items_fast(raw: list[Any]) -> list[PutItem] | None:
    """``(key, value)`` pairs if every item has the shape almost every JSON putMany has; None: not that shape.

    ``{"key": {"value": s}, "value": {"value": s} | null}`` with nothing else (no ``encoding``, so utf8).
    Anything unexpected (a missing field, a list, a number, a lone surrogate) ends the fast path and the
    validating parser reports it.
    """
    items: list[PutItem] = []
    append = items.append
    try:
        for item in raw:
            key = item["key"]
            value = item["value"]
            if len(item) != 2 or len(key) != 1:
                return None
            if value is None:
                append((key["value"].encode(), None))
            elif len(value) != 1:
                return None
            else:
                append((key["value"].encode(), value["value"].encode()))
    except (KeyError, TypeError, AttributeError, UnicodeEncodeError):
        return None
    return items


def parse_items(raw: list[Any], codec: Codec) -> list[PutItem]:
    """Parses putMany items: ``(key, value)`` pairs when every item has the common shape of its codec (a
    10k-item body is the hot loop; pairs are also what the engine stores fastest), otherwise
    ``(key, value, if_not_present)`` triples from the validating parser, which reports the first bad item.
    """
    fast = _msgpack_items_fast(raw) if codec.binary else _json_items_fast(raw)
    if fast is not None:
        return fast
    return [
        parse_item({"key": item[0], "value": item[1]} if type(item) is tuple else item, codec, f"items[{i}]")
        for i, item in enumerate(raw)
    ]


def item_to_wire(item: PutItem, codec: Codec) -> Body:
    """The body of one item (the client's side)."""
    body = {"key": codec.es(item[0]), "value": codec.es_opt(item[1])}
    if len(item) == 3 and item[2]:
        body["ifNotPresent"] = True
    return body
