"""Retention against a small reference model (hypothesis): with a reader moving, policies set and changed and
time passing, exactly the generations the model keeps stay readable, each with its whole content."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffstore import Store, StoreConfig
from diffstore.engine.types import RetentionPolicy, wall_clock_ms
from diffstore.errors import GenerationCollected

from .util import as_dict, commit, run_background

KEYS = [b"a", b"b", b"c", b"d"]


@dataclass
class Model:
    """What the store should hold: every committed generation (id, commit time, content), the reader,
    the policy, and the GC horizon (the highest point GC ever collected below)."""

    now: int
    gens: list[tuple[bytes, int | None, dict[bytes, bytes]]] = field(default_factory=list)
    reader: bytes | None = None
    policy: RetentionPolicy | None = None
    horizon: bytes | None = None

    def kept(self) -> bytes | None:
        policy = self.policy
        if policy is None:
            return None
        found = []
        if policy.keep_generations is not None:
            ids = [gid for gid, _, _ in self.gens]
            found.append(ids[-policy.keep_generations] if len(ids) >= policy.keep_generations else b"")
        if policy.keep_ms is not None:
            cutoff = self.now - policy.keep_ms
            older = [gid for gid, at, _ in self.gens if at is None or at <= cutoff]
            found.append(older[-1] if older else b"")
        return min(found)

    def collect(self) -> None:
        """GC run to the end."""
        minimum = self.reader or b""
        kept = self.kept()
        if kept is not None:
            minimum = min(minimum, kept)
        if not minimum:
            return
        current = self.gens[-1][0]
        horizon = min(max(minimum, self.horizon or b""), current)
        if horizon and horizon > (self.horizon or b""):
            self.horizon = horizon

    def floor(self) -> bytes | None:
        floor = self.horizon
        minimum = self.reader or b""
        kept = self.kept()
        if kept is not None and minimum:
            minimum = min(minimum, kept)
        if minimum:
            live = min(minimum, self.gens[-1][0])
            if floor is None or live > floor:
                floor = live
        return floor


OPS = st.one_of(
    st.tuples(st.just("commit"), st.dictionaries(st.sampled_from(KEYS), st.binary(max_size=2), max_size=3)),
    st.tuples(st.just("reader"), st.integers(0, 40)),
    st.tuples(
        st.just("policy"),
        st.one_of(st.none(), st.integers(1, 4)),
        st.one_of(st.none(), st.sampled_from([1_000, 5_000, 20_000])),
    ),
    st.tuples(st.just("tick"), st.sampled_from([500, 3_000, 10_000])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=30))
def test_exactly_the_kept_generations_stay_readable(ops: list[tuple]) -> None:
    model = Model(now=wall_clock_ms())  # the store's clock: commits, reads and GC read it
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(directory, StoreConfig(background=False, clock_ms=lambda: model.now))
        try:
            c = store.create_collection("c", manual=True)
            c.create_reader("r")
            model.gens.append((b"", None, {}))
            for op in ops:
                _apply(store, model, op)
                run_background(store)
                model.collect()
                _check(store, model)
        finally:
            store.close()


def _apply(store: Store, model: Model, op: tuple) -> None:
    c = store.collection("c")
    kind = op[0]
    if kind == "commit":
        gid = b"%03d" % len(model.gens)
        content = dict(model.gens[-1][2])
        content.update(op[1])
        commit(c, gid, sorted(op[1].items()))
        model.gens.append((gid, model.now, content))
        model.now += 1
    elif kind == "reader":
        committed = [gid for gid, _, _ in model.gens if gid]
        if not committed:
            return
        target = committed[op[1] % len(committed)]
        floor = model.floor()
        try:
            c.update_reader("r", target)
        except GenerationCollected:
            assert floor is not None and target < floor
        else:
            assert floor is None or target >= floor
            model.reader = target
    elif kind == "policy":
        policy = RetentionPolicy(keep_generations=op[1], keep_ms=op[2])
        c.set_retention(policy)
        model.policy = None if policy.empty else policy
    else:
        model.now += op[1]


def _check(store: Store, model: Model) -> None:
    c = store.collection("c")
    floor = model.floor()
    for gid, _, content in model.gens:
        kept = floor is None or gid >= floor
        try:
            found = as_dict(c, generation_id=gid)
        except GenerationCollected:
            assert not kept, f"{gid!r} is collected but the model keeps it (floor {floor!r})"
        else:
            assert kept, f"{gid!r} is readable but the model collected it (floor {floor!r})"
            assert found == {key: value for key, value in content.items()}
    listed = {info.generation_id: info.collected for info in c.history(limit=1000)[0]}
    assert listed == {gid: not (floor is None or gid >= floor) for gid, _, _ in model.gens}
