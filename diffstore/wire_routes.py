"""Which requests change a store: the one rule the server's write gate and the clients' routing share.

A read replica (and a primary that stepped down) lets every read through and refuses every write; a
client given several servers sends reads and writes by the same rule (:mod:`diffstore.client._leader`).
Reads are every GET, the POSTs that read (get, getMany, getKeysAround, query, diff, lineage, a
generation's records), forgetting a cursor, and the replica routes themselves; everything else -- any
route added later included -- is a write.
"""

from __future__ import annotations

import re

_READS = re.compile(
    r"/collections/[^/]+/(get|getMany|getKeysAround|query|diff|lineage|generations/records)/?"
)
_FORGET_CURSOR = re.compile(r"/collections/[^/]+/(query|diff)/[^/]+/?")
_REPLICA_ROUTES = re.compile(r"/replica/(promote|stepDown|stepUp)/?")


def is_write(method: str, path: str) -> bool:
    """Whether a request may change the store (what a replica, or a stepped-down primary, refuses)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return False
    if method == "POST":
        return not (_READS.fullmatch(path) or _REPLICA_ROUTES.fullmatch(path))
    if method == "DELETE":
        return not _FORGET_CURSOR.fullmatch(path)
    return True
