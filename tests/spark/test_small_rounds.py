"""Small rounds (every diff read on the driver, the result written from it) keep the round's guarantees."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from helpers_spark import commit_items, snapshot
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from diffstore import Store
from diffstore.spark import Transform, TransformError
from diffstore.spark.small_rounds import ARROW_LOCAL_RELATION_THRESHOLD, EXCLUDED_RULES, PUT_BATCH

TOO_LONG_KEY = b"\xff" * (1 << 24)  # one byte over the longest key: the server refuses the putMany holding it


def _readers(store: Store, name: str) -> dict[str, bytes | None]:
    return {r.name: r.generation_id for r in store.collection(name).readers()}


def test_a_small_round_refused_after_a_first_put_batch_leaves_the_target_untouched(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    for name in names.values():
        store.create_collection(name, manual=True)
    commit_items(store, names["A"], [(b"a1", b"x")])
    commit_items(store, names["C"], [(b"kept", b"1")])
    c = store.collection(names["C"])
    c.create_reader("from_a", names["A"], None)

    def fn(spark_: Any, diffs: dict[str, DataFrame], lookup: Any) -> DataFrame:
        good = spark_.range(PUT_BATCH).select(
            F.format_string("k%06d", "id").cast("binary").alias("key"), F.lit(b"v").alias("value")
        )
        bad = spark_.createDataFrame([(TOO_LONG_KEY, b"v")], "key binary, value binary")
        # sorted, so that the first put batch is written before the one holding the bad key is refused
        return good.unionByName(bad).orderBy("key")

    before = (c.generation_id, _readers(store, names["C"]), snapshot(store, names["C"]))
    events: list[str] = []
    transform = Transform(
        spark,
        server_url,
        names["C"],
        {"a": names["A"]},
        fn,
        max_attempts=1,
        on_event=lambda event, details: events.append(event),
    )
    try:
        with pytest.raises(TransformError, match="key"):
            transform.run()
    finally:
        transform.close()
    c = store.collection(names["C"])
    assert c.next_generation_id is None  # the round's generation was aborted, its first batch with it
    assert before == (c.generation_id, _readers(store, names["C"]), snapshot(store, names["C"]))
    assert events[:2] == ["planned", "started"] and "failed" in events and "committed" not in events


def test_a_small_round_with_one_source_unchanged_and_deletes(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    """B's diff is empty (a local relation with no rows), A's holds updates and a delete; B's lookup for
    A's users runs on the driver with getMany, the target's for the totals in the result's job."""
    from helpers_spark import load_example_job

    job = load_example_job()
    for name in names.values():
        store.create_collection(name, manual=True)
    commit_items(store, names["A"], [(b"u1", b"DE"), (b"u2", b"FR"), (b"u3", b"DE")])
    commit_items(store, names["B"], [(b"u1", b"5"), (b"u2", b"7"), (b"u3", b"11")])
    sources = {"a": names["A"], "b": names["B"]}
    transform = Transform(spark, server_url, names["C"], sources, job.country_totals)
    try:
        (first,) = transform.run()
        assert first.rows_read == {"a": 3, "b": 3}
        commit_items(store, names["A"], [(b"u1", b"FR"), (b"u3", None)])
        (second,) = transform.run()
        assert second.rows_read == {"a": 2, "b": 0} and second.rows_written == 2
    finally:
        transform.close()
    assert snapshot(store, names["C"]) == {b"FR": b"12"}  # DE lost both users: deleted
    assert snapshot(store, names["C"]) == job.recompute(
        snapshot(store, names["A"]), snapshot(store, names["B"])
    )


def test_a_small_round_plans_for_small_data_and_restores_the_session(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    """During a small round the session runs without adaptive execution, with one shuffle partition,
    without folding projections into local data (``ConvertToLocalRelation``, added to the optimizer rules
    the user excluded) and with the round's Arrow data above 128 KiB as RDDs (a local relation's rows are
    walked by every analysis); the user's settings are back afterwards, after a failed round too."""
    keys = ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions", ARROW_LOCAL_RELATION_THRESHOLD)

    def current(session: Any) -> tuple[str | None, ...]:
        return (*(session.conf.get(key) for key in keys), session.conf.get(EXCLUDED_RULES, None))

    users_rule = "org.apache.spark.sql.catalyst.optimizer.ReorderJoin"
    folding = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"
    for name in names.values():
        store.create_collection(name, manual=True)
    # 2,000 changes of ~110 bytes: above the small round's 128 KiB, below the user's 1 MiB threshold
    first = [(b"a%04d" % i, b"x" * 100) for i in range(2000)]
    commit_items(store, names["A"], first)
    seen: list[tuple[str, ...]] = []
    plans: list[str] = []

    def fn(spark_: Any, diffs: dict[str, DataFrame], lookup: Any) -> DataFrame:
        seen.append(current(spark_))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            diffs["a"].explain()
        plans.append(printed.getvalue())
        if len(seen) > 1:
            raise RuntimeError("the second round fails")
        return diffs["a"].select("key", F.col("toValue").alias("value"))

    before = current(spark)
    assert before[3] is None
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    spark.conf.set(EXCLUDED_RULES, users_rule)
    spark.conf.set(ARROW_LOCAL_RELATION_THRESHOLD, "1048576")
    transform = Transform(spark, server_url, names["C"], {"a": names["A"]}, fn, max_attempts=1)
    try:
        assert len(transform.run()) == 1
        assert current(spark) == (before[0], "3", "1048576", users_rule)
        commit_items(store, names["A"], [(b"a2", b"y")])
        spark.conf.unset(EXCLUDED_RULES)
        with pytest.raises(TransformError, match="second round"):
            transform.run()
        assert current(spark) == (before[0], "3", "1048576", None)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before[1])
        spark.conf.set(ARROW_LOCAL_RELATION_THRESHOLD, before[2])
        spark.conf.unset(EXCLUDED_RULES)
        transform.close()
    small = str(128 * 1024)
    assert seen == [("false", "1", small, f"{users_rule},{folding}"), ("false", "1", small, folding)]
    # The large diff is scanned from an RDD, where the user's threshold would make it local data; the
    # one-change diff stays local (a Connect server makes local relations whatever the setting says).
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        assert "Scan ExistingRDD" in plans[0] and "LocalTableScan" not in plans[0], plans[0]
        assert "LocalTableScan" in plans[1] and "ExistingRDD" not in plans[1], plans[1]
    assert snapshot(store, names["C"]) == dict(first)


def test_a_small_diff_is_read_in_pages_up_to_the_limit(
    spark: Any, server_url: str, store: Store, names: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above one page the driver keeps paging while the diff fits ``local_diff_max_rows``; one change more
    and the round is left to Spark's tasks (None)."""
    from diffstore.spark import small_rounds
    from diffstore.spark.plan import SourceRange

    monkeypatch.setattr(small_rounds, "PAGE_ROWS", 2)  # pages of 2, so that 5 changes take 3 pages
    for name in names.values():
        store.create_collection(name, manual=True)
    first = commit_items(store, names["A"], [(b"k%d" % i, b"v") for i in range(5)])
    last = commit_items(store, names["A"], [(b"k1", None), (b"k9", b"w")])
    source = SourceRange("a", names["A"], None, last)
    transform = Transform(spark, server_url, names["C"], {"a": names["A"]}, lambda *_: None)
    try:
        for limit, expected in ((6, 5), (5, 5), (4, None)):
            transform.local_diff_max_rows = limit
            table = small_rounds.read_small_diff(transform, source)
            assert (None if table is None else table.num_rows) == expected, limit
        transform.local_diff_max_rows = 5
        table = small_rounds.read_small_diff(transform, source)
        assert table is not None
        assert table.column("key").to_pylist() == [b"k0", b"k2", b"k3", b"k4", b"k9"]
        assert small_rounds.read_small_diff(transform, SourceRange("a", names["A"], first, last)) is not None
    finally:
        transform.close()


def test_a_diff_whose_generation_wrote_more_than_the_limit_is_not_paged_on_the_driver(
    spark: Any, server_url: str, store: Store, names: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the history says a generation of the range wrote more keys than ``local_diff_max_rows``, the
    round goes to Spark's tasks without reading a page on the driver first; generations of the range
    that each wrote fewer are paged (only the whole diff's size decides), and so is a range whose end is
    older than the history's first page."""
    from diffstore.client import Collection
    from diffstore.spark import small_rounds
    from diffstore.spark.plan import SourceRange

    pages: list[object] = []
    read_page = Collection.diff_page_columns
    monkeypatch.setattr(
        Collection, "diff_page_columns", lambda self, *a, **k: pages.append(a) or read_page(self, *a, **k)
    )
    for name in names.values():
        store.create_collection(name, manual=True)
    first = commit_items(store, names["A"], [(b"k%d" % i, b"v") for i in range(5)])
    second = commit_items(store, names["A"], [(b"k1", None), (b"k9", b"w")])
    third = commit_items(store, names["A"], [(b"k2", b"x"), (b"k8", b"y")])
    transform = Transform(spark, server_url, names["C"], {"a": names["A"]}, lambda *_: None)
    try:
        transform.local_diff_max_rows = 4
        assert small_rounds.read_small_diff(transform, SourceRange("a", names["A"], None, third)) is None
        assert pages == []  # the first generation wrote 5 keys
        # 2 + 2 keys written: paged, then found to be 4 changes
        table = small_rounds.read_small_diff(transform, SourceRange("a", names["A"], first, third))
        assert table is not None and table.column("key").to_pylist() == [b"k1", b"k2", b"k8", b"k9"]
        assert len(pages) == 1
        transform.local_diff_max_rows = 3  # 4 changes: paged (pages of 3), and over the limit
        assert small_rounds.read_small_diff(transform, SourceRange("a", names["A"], first, third)) is None
        assert len(pages) == 3
        monkeypatch.setattr(small_rounds, "HISTORY_PEEK", 1)  # the range's end is below the first page
        transform.local_diff_max_rows = 4
        assert small_rounds.read_small_diff(transform, SourceRange("a", names["A"], None, second)) is None
        assert len(pages) == 5
    finally:
        transform.close()


def test_a_small_round_computes_the_result_once_for_the_target_lookup_and_the_write(
    spark: Any, server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    """The target's lookup reads the keys of the result's own aggregation in the result's job: each changed
    row goes through the user's computation once per round, not once for the lookup's keys and once more
    for the result (the old driver-side lookup of the target: 6 evaluations, then 8)."""
    from diffstore.spark import TARGET

    for name in names.values():
        store.create_collection(name, manual=True)
    commit_items(store, names["A"], [(b"u1", b"DE"), (b"u2", b"FR"), (b"u3", b"DE")])
    calls = tmp_path / "calls"
    calls.touch()

    @F.udf("binary")
    def counted(value: bytes | None) -> bytes | None:
        with open(calls, "a") as out:  # one line per evaluation, from Spark's Python worker
            out.write("x\n")
        return value

    def fn(spark_: Any, diffs: dict[str, DataFrame], lookup: Any) -> DataFrame:
        users = diffs["a"].select(counted("toValue").alias("country"))
        # the keys keep the whole aggregation (a filter on its values, like the example's `delta != 0`):
        # Spark computes it once for both
        counts = users.groupBy("country").agg(F.count("*").alias("n")).where(F.col("n") > 0)
        before = lookup(TARGET, counts.select(F.col("country").alias("key")))
        old = F.coalesce(before["value"].cast("string").cast("long"), F.lit(0))
        return counts.join(before, counts["country"] == before["key"], "left").select(
            F.col("country").alias("key"), (old + F.col("n")).cast("string").cast("binary").alias("value")
        )

    transform = Transform(spark, server_url, names["C"], {"a": names["A"]}, fn)
    try:
        (first,) = transform.run()
        assert calls.read_text().count("x") == 3
        commit_items(store, names["A"], [(b"u4", b"FR")])
        (second,) = transform.run()
        assert calls.read_text().count("x") == 4
    finally:
        transform.close()
    assert first.rows_written == 2 and second.rows_written == 1
    assert snapshot(store, names["C"]) == {b"DE": b"2", b"FR": b"2"}


@pytest.mark.parametrize("target_max_rows", [1_000, 2])
def test_a_small_targets_lookup_is_local_data_and_a_larger_ones_is_read_by_executors(
    spark: Any,
    server_url: str,
    store: Store,
    names: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    target_max_rows: int,
) -> None:
    """A target of at most ``TARGET_LOCAL_MAX_ROWS`` records is read whole on the driver and its lookup is
    a join with local data (no Python worker: no ``MapInArrow`` in the plan); a larger one is looked up by
    executors. Either way the lookup answers every requested key once, null where the target has none,
    and the rounds agree with a recomputation. (Before, every small round's target lookup ran
    ``mapInArrow``.)"""
    from helpers_spark import load_example_job

    from diffstore.spark import TARGET, small_rounds

    monkeypatch.setattr(small_rounds, "TARGET_LOCAL_MAX_ROWS", target_max_rows)
    job = load_example_job()
    for name in names.values():
        store.create_collection(name, manual=True)
    commit_items(store, names["A"], [(b"u1", b"DE"), (b"u2", b"FR"), (b"u3", b"DE"), (b"u4", b"JP")])
    commit_items(store, names["B"], [(b"u1", b"5"), (b"u2", b"7"), (b"u3", b"11"), (b"u4", b"2")])
    plans: list[str] = []
    answers: list[dict[bytes, bytes | None]] = []

    def fn(spark_: Any, diffs: dict[str, DataFrame], lookup: Any) -> DataFrame:
        def spied(alias: str, keys: DataFrame) -> DataFrame:
            found = lookup(alias, keys)
            if alias == TARGET:
                capsys.readouterr()
                found.explain()
                plans.append(capsys.readouterr().out)
                rows = found.collect()
                answers.append({bytes(r[0]): None if r[1] is None else bytes(r[1]) for r in rows})
                assert len(answers[-1]) == len(rows)  # each key once
            return found

        return job.country_totals(spark_, diffs, spied)  # type: ignore[no-any-return]

    transform = Transform(spark, server_url, names["C"], {"a": names["A"], "b": names["B"]}, fn)
    try:
        transform.run()  # the first round: C was empty
        commit_items(store, names["A"], [(b"u2", b"DE"), (b"u4", b"BR")])
        transform.run()
    finally:
        transform.close()
    assert answers == [
        {b"DE": None, b"FR": None, b"JP": None},
        {b"DE": b"16", b"FR": b"7", b"JP": b"2", b"BR": None},
    ]
    local = target_max_rows >= 3  # C holds 3 records before the second round
    assert ("MapInArrow" in plans[1]) is not local, plans[1]
    assert "MapInArrow" not in plans[0]  # an empty target: nothing to read
    assert snapshot(store, names["C"]) == job.recompute(
        snapshot(store, names["A"]), snapshot(store, names["B"])
    )
