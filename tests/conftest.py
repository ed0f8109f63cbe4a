"""Settings every test shares.

Hypothesis's per-example deadline (200 ms by default) and its "too slow" health check are timing
thresholds: on this project's shared, loaded machines an example that usually takes 30 ms can take 300 ms,
and the test fails for no bug. The tests wait on conditions, never on time, so both are off for all.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("diffstore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("diffstore")
