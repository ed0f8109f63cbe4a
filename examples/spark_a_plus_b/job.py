"""The A+B→C job: A = user → country, B = user → purchase amount, C = country → total amount.

Incremental, from the diffs only: every changed user takes its old contribution (old country, old amount)
away from the old country and adds its new one to the new country. A user's old/new value in the source
that did *not* change is looked up at the round's pinned generation (it is the same before and after).
C's new total is its value before the round plus the country's delta; a total of 0 deletes the country
(amounts are positive, so 0 means no user contributes any more).

Only Spark SQL expressions are used, so Spark's workers need nothing of this module.
Values are UTF-8 text: a country name, an integer amount, an integer total.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from diffstore.spark import TARGET


def _amount(column: str) -> Column:
    return F.col(column).cast("string").cast("long")


def country_totals(
    spark: SparkSession, diffs: Mapping[str, DataFrame], lookup: Callable[[str, DataFrame], DataFrame]
) -> DataFrame:
    """C's changes for one round; ``diffs`` has aliases ``a`` (countries) and ``b`` (amounts)."""
    a = diffs["a"].select(
        "key", F.lit(True).alias("in_a"), F.col("fromValue").alias("a_from"), F.col("toValue").alias("a_to")
    )
    b = diffs["b"].select(
        "key", F.lit(True).alias("in_b"), F.col("fromValue").alias("b_from"), F.col("toValue").alias("b_to")
    )
    changed = a.join(b, "key", "full_outer")
    # The side that did not change for a user has one value for old and new: look it up.
    a_now = lookup("a", changed.where(F.col("in_a").isNull()).select("key")).withColumnRenamed(
        "value", "a_now"
    )
    b_now = lookup("b", changed.where(F.col("in_b").isNull()).select("key")).withColumnRenamed(
        "value", "b_now"
    )
    users = (
        changed.join(a_now, "key", "left")
        .join(b_now, "key", "left")
        .select(
            F.when(F.col("in_a"), F.col("a_from")).otherwise(F.col("a_now")).alias("old_country"),
            F.when(F.col("in_a"), F.col("a_to")).otherwise(F.col("a_now")).alias("new_country"),
            F.when(F.col("in_b"), _amount("b_from")).otherwise(_amount("b_now")).alias("old_amount"),
            F.when(F.col("in_b"), _amount("b_to")).otherwise(_amount("b_now")).alias("new_amount"),
        )
    )
    contributions = users.select(
        F.explode(
            F.array(
                F.struct(F.col("old_country").alias("country"), (-F.col("old_amount")).alias("amount")),
                F.struct(F.col("new_country").alias("country"), F.col("new_amount").alias("amount")),
            )
        ).alias("c")
    ).select("c.country", "c.amount")
    deltas = (
        contributions.where(F.col("country").isNotNull() & F.col("amount").isNotNull())
        .groupBy("country")
        .agg(F.sum("amount").alias("delta"))
        .where(F.col("delta") != 0)
    )
    before = lookup(TARGET, deltas.select(F.col("country").alias("key")))
    totals = deltas.join(before, deltas["country"] == before["key"], "left").select(
        F.col("country").alias("key"),
        (F.coalesce(_amount("value"), F.lit(0)) + F.col("delta")).alias("total"),
    )
    return totals.select(
        "key",
        F.when(F.col("total") == 0, F.lit(None).cast("binary"))
        .otherwise(F.col("total").cast("string").cast("binary"))
        .alias("value"),
    )


def recompute(countries: Mapping[bytes, bytes], amounts: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """C from scratch, in plain Python: the reference the incremental job must always agree with."""
    totals: dict[bytes, int] = {}
    for user, country in countries.items():
        if user in amounts:
            totals[country] = totals.get(country, 0) + int(amounts[user])
    return {country: str(total).encode() for country, total in totals.items() if total != 0}
