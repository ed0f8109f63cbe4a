"""An incremental consumer in the style of LinkedIn Databus 2.0: consistency windows over diffs.

A :class:`Consumer` declares its sources (collections, in order) and keeps, in a checkpoint collection of
its own, one reader per source (reader name = source name, target = the source). It delivers
*consistency windows*: ``on_start_window(from)``; for each source in declared order ``on_start_source``,
``on_data_event(source, key, old, new)``…, ``on_end_source``; then ``on_end_window(to)``; and only then
writes the checkpoint. Caught up, it waits on the long poll (or on the engine's commit listener).

Delivery guarantee — what holds, exactly:
    * **Contiguous, in-order windows.** For every source, each checkpointed window starts where the
      previous checkpointed window ended. Nothing is skipped: every change of a source between the
      consumer's first position and its current checkpoint was delivered in a window that was then
      checkpointed.
    * **Net changes.** A window carries the diff of each source over (from, to]: one event per changed
      key, ``old`` = the value at ``from``, ``new`` = the value at ``to`` (``None`` = absent). A key
      changed several times inside one window appears once; a key changed and changed back, not at all.
      Keys come in ascending order within a source. A window's ``to`` may stop short of the source's
      current generation when the server splits a huge range; the rest comes in the next window.
    * **At-least-once windows.** A window may be delivered more than once: after a rollback (a callback
      raised or returned ``False``; ``on_rollback`` is called, then the *same* window — same ``from``,
      same requested ``to`` — is replayed), after an I/O error inside the window (``on_rollback``, then
      the error propagates -- except an outage of the server, which :meth:`Consumer.run` rides out; the next
      run, or the loop after the outage, reloads the checkpoint), and after a crash or a lost checkpoint
      answer (no ``on_rollback``: the process may be gone). A consumer whose window processing is
      idempotent, or commits its own state together with ``to``, gets effectively-once processing.
    * **Exactly-once checkpoint advance.** The checkpoint is the set of readers in a *manual* checkpoint
      collection; it moves from a window's ``from`` to its ``to`` in one generation commit that updates
      every reader with compare-and-set (``expected`` = the loaded positions). So it never goes backwards,
      never moves twice for one window, never moves for some sources only, and a second consumer running
      on the same checkpoint cannot overwrite progress: the loser gets ``badVersion``, reloads, and
      continues from the winner's checkpoint. (Run one consumer per checkpoint collection; two would
      each see windows the other also saw -- unless they keep its lease, below.) Because readers pin
      garbage collection, the sources keep every generation the consumer still needs.

Parallel consumption (``workers=N``): a window's data events are partitioned by key over N threads --
different keys concurrently, one key in order -- with a barrier before ``on_end_source`` and so before the
checkpoint; a failure in any partition rolls the whole window back and replays it. The bookkeeping is
:class:`~diffstore.consumer._partitions.PartitionMachine`, pure like the window machine; the threads are
``_pool.py``. The guarantee above holds unchanged.

Standby consumers (``lease_ttl_ms=T``): any number of consumers of one checkpoint collection, exactly one
active -- the holder of the collection's lease ``consumer`` (:mod:`diffstore.lease_keeper`), whose checkpoints
carry the lease's fencing token, so a consumer that lost it never checkpoints again. A standby takes over
within T + one poll of the active one's death and continues from the stored checkpoint.

The window logic is :class:`WindowMachine` (``_window.py``), a pure state machine (no I/O, h11 style):
it answers "what next" with an action and is fed the outcome. :class:`Consumer` (``_loop.py``) is the
thin loop that performs actions on a :class:`ConsumerStore` — the HTTP :class:`~diffstore.client.Client`
or an embedded engine ``Store``.
"""

from diffstore.consumer._loop import (
    ChangeWaiter,
    CommitWaiter,
    Consumer,
    ConsumerStalled,
    ConsumerStore,
    WindowListener,
)
from diffstore.consumer._window import (
    DataEvent,
    EndSource,
    EndWindow,
    Positions,
    Rollback,
    StartSource,
    StartWindow,
    WindowMachine,
)

__all__ = [
    "ChangeWaiter",
    "CommitWaiter",
    "Consumer",
    "ConsumerStalled",
    "ConsumerStore",
    "DataEvent",
    "EndSource",
    "EndWindow",
    "Positions",
    "Rollback",
    "StartSource",
    "StartWindow",
    "WindowListener",
    "WindowMachine",
]
