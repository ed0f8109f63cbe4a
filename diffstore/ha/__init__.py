"""Automatic fail-over on etcd (``diffstore serve --ha-etcd``): members of a cluster elect one leader
through a key held by an etcd lease; the leader is the primary, every other member a replica of it.

- :mod:`diffstore.ha.election`: the election as a pure state machine (events in, actions out);
- :mod:`diffstore.ha.etcd`: etcd's JSON gateway over httpx;
- :mod:`diffstore.ha.member`: the thread that wires them to the store and the replica follower;
- :mod:`diffstore.ha.cli`: ``serve``'s ``--ha-*`` options and ``diffstore ha status``.

(Nothing is imported here: ``diffstore ha`` must start quickly.)

``docs/failover.md`` is the user's guide.
"""

from __future__ import annotations
