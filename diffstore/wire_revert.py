"""``POST /collections/{c}/revert`` (SPEC §8) on the wire, shared by the server and the client.

Request ``{toGenerationId: ES, generationId?: ES, lease?: {name, version}}``; answer
``{generationId: ES, changedKeys: int}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diffstore.engine.types import LeaseToken, RevertResult
from diffstore.wire import Body, Codec, Fields
from diffstore.wire_leases import token_from_fields, token_to_wire

if TYPE_CHECKING:
    from diffstore.collection import Collection


@dataclass(frozen=True, slots=True)
class RevertRequest:
    """Revert to ``to_generation_id``, writing into the open generation ``generation_id`` (a manual
    collection must name it; None: a non-manual collection's next one), under ``lease`` when the open
    generation was started under one."""

    to_generation_id: bytes
    generation_id: bytes | None = None
    lease: LeaseToken | None = None

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> RevertRequest:
        f = Fields(obj, codec)
        return cls(f.es("toGenerationId"), f.es_opt("generationId"), token_from_fields(f))

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"toGenerationId": codec.es(self.to_generation_id)}
        if self.generation_id is not None:
            body["generationId"] = codec.es(self.generation_id)
        if self.lease is not None:
            body["lease"] = token_to_wire(self.lease)
        return body

    def run(self, collection: Collection) -> RevertResult:
        return collection.revert(self.to_generation_id, generation_id=self.generation_id, lease=self.lease)


def revert_result_to_wire(result: RevertResult, codec: Codec) -> Body:
    return {"generationId": codec.es(result.generation_id), "changedKeys": result.changed_keys}


def revert_result_from_wire(obj: Any, codec: Codec) -> RevertResult:
    f = Fields(obj, codec, "response")
    return RevertResult(f.es("generationId"), f.integer("changedKeys", 0, 2**63 - 1))
