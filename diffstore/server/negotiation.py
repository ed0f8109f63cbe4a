"""Content negotiation (SPEC §2): which codec parses a request body and which one renders the answer."""

from __future__ import annotations

from diffstore.errors import InvalidRequest
from diffstore.wire import JSON, MSGPACK, MSGPACK_MEDIA_TYPES, Codec


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


def response_codec(accept: str | None) -> Codec:
    """msgpack when ``Accept`` names a msgpack media type (with a non-zero q), else JSON."""
    if not accept:
        return JSON
    for entry in accept.split(","):
        media_type, _, params = entry.partition(";")
        if media_type.strip().lower() in MSGPACK_MEDIA_TYPES:
            q = params.replace(" ", "").lower()
            if "q=0" in q and not any(f"q=0.{d}" in q for d in "123456789"):
                continue
            return MSGPACK
    return JSON
