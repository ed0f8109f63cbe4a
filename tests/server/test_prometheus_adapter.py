"""The installed prometheus_client still has the histogram insides the adapter uses, and batching a
histogram's updates gives exactly what observing each value does."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diffstore.server import prometheus_adapter

VALUES = [0.0, 0.005, 0.005, 0.0051, 0.3, 7.5, 10.0, 11.0, 1e9]


def test_the_installed_histograms_are_batchable() -> None:
    registry = CollectorRegistry()
    assert prometheus_adapter.batchable(Histogram("plain_seconds", "x", registry=registry))
    labelled = Histogram("labelled_seconds", "x", ["route"], registry=registry)
    assert prometheus_adapter.batchable(labelled.labels("/a"))


@pytest.mark.parametrize("values", [[], [0.001], VALUES, [0.3] * 50 + [2.5] * 7])
def test_observe_all_is_observe_one_by_one(values: list[float]) -> None:
    batched, one_by_one = CollectorRegistry(), CollectorRegistry()
    prometheus_adapter.observe_all(Histogram("x_seconds", "x", registry=batched), values)
    histogram = Histogram("x_seconds", "x", registry=one_by_one)
    for value in values:
        histogram.observe(value)
    assert _samples(batched) == _samples(one_by_one)
    assert _samples(batched)[("x_seconds_count", ())] == len(values)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if not sample.name.endswith("_created")  # when each histogram was made
    }


class _OtherHistogram:
    """A histogram without prometheus_client's insides (as another version might have it)."""

    def __init__(self) -> None:
        self.observed: list[float] = []

    def observe(self, value: float) -> None:
        self.observed.append(value)


def test_a_histogram_unlike_the_installed_ones_is_observed_one_by_one() -> None:
    other = _OtherHistogram()
    assert not prometheus_adapter.batchable(other)
    prometheus_adapter.observe_all(other, VALUES)
    assert other.observed == VALUES
