"""Content negotiation (SPEC §2): which codec parses a request body and which one renders the answer."""

from __future__ import annotations

from diffstore.errors import InvalidRequest
from diffstore.wire import COLUMNS, JSON, MSGPACK, MSGPACK_MEDIA_TYPES, Codec
from diffstore.wire_columns import COLUMNS_CONTENT_TYPE


def request_codec(content_type: str | None) -> Codec:
    """The codec of a request body: JSON when ``Content-Type`` is absent or JSON, msgpack when asked.

    Raises:
        InvalidRequest: any other media type, or a JSON charset other than UTF-8.
    """
    if content_type is None or not content_type.strip():
        return JSON
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type == "application/json":
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
                "utf-8",
                "utf8",
            ):
                raise InvalidRequest(f"unsupported charset in Content-Type {content_type!r}: use utf-8")
        return JSON
    if media_type in MSGPACK_MEDIA_TYPES:
        return MSGPACK
    raise InvalidRequest(
        f"unsupported Content-Type {content_type!r}: use application/json or application/msgpack"
    )


def response_codec(accept: str | None, columns: bool = False) -> Codec:
    """msgpack when ``Accept`` names a msgpack media type (with a non-zero q), else JSON.

    The columns form (:mod:`diffstore.wire_columns`) counts as msgpack; it is answered only where
    ``columns`` says the route has it (query and diff pages, getMany): everywhere else, plain msgpack.
    """
    if not accept:
        return JSON
    found = JSON
    for entry in accept.split(","):
        media_type, _, params = entry.partition(";")
        media_type = media_type.strip().lower()
        if media_type not in MSGPACK_MEDIA_TYPES and media_type != COLUMNS_CONTENT_TYPE:
            continue
        q = params.replace(" ", "").lower()
        if "q=0" in q and not any(f"q=0.{d}" in q for d in "123456789"):
            continue
        if media_type == COLUMNS_CONTENT_TYPE and columns:
            return COLUMNS
        found = MSGPACK
    return found
