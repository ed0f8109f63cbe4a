"""mypy's check that both collection handles implement :class:`diffstore.collection.Collection`.

Nothing imports this module: it imports the engine's and the client's handles, and a check placed
in :mod:`diffstore.collection` (which both import) would tie them all into one import circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffstore.client import Collection as ClientCollection
    from diffstore.collection import Collection
    from diffstore.engine.collection import Collection as EngineCollection

    def _implementations(engine: EngineCollection, client: ClientCollection) -> list[Collection]:
        return [engine, client]
