"""Everything diffstore knows of prometheus_client's insides: one histogram update for many values.

prometheus_client's public ``Histogram.observe`` takes one value, and in multiprocess mode each call is
a locked write to the worker's file. A long-poll fan-out answers a thousand requests at once, so
:func:`observe_all` adds each bucket's count in one update through the histogram's ``_upper_bounds``,
``_buckets`` and ``_sum``. A histogram that does not have them as expected (another prometheus_client)
gets one ``observe`` per value: the same result, only slower. ``tests/server/test_prometheus_adapter.py``
fails loudly when the installed prometheus_client stops matching.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any


def batchable(histogram: Any) -> bool:
    """True if ``histogram`` (a ``Histogram`` or a labelled child) has what :func:`observe_all` uses."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    return (
        bounds is not None
        and buckets is not None
        and getattr(histogram, "_sum", None) is not None
        and len(bounds) == len(buckets)
    )


def observe_all(histogram: Any, values: list[float]) -> None:
    """As ``histogram.observe(v)`` for each of ``values``, in one update per bucket hit."""
    if not batchable(histogram):
        for value in values:
            histogram.observe(value)
        return
    # Histogram.observe's own rule: the first bucket whose upper bound is >= the value (the last is +Inf)
    hits = collections.Counter(bisect.bisect_left(histogram._upper_bounds, value) for value in values)
    for index, count in hits.items():
        histogram._buckets[index].inc(count)
    histogram._sum.inc(sum(values))
