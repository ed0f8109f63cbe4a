"""Settings every test shares.

Hypothesis's per-example deadline (200 ms by default) is a timing threshold: on this project's shared,
loaded machines an example that usually takes 30 ms can take 300 ms, and the test fails for no bug.
The tests wait on conditions, never on time, so the deadline is off for all of them.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("diffstore", deadline=None)
settings.load_profile("diffstore")
