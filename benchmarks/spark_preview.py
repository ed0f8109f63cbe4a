"""Transform previews: seconds per preview against seconds per real round of the same changes.

    python benchmarks/spark_preview.py [--records 20000] [--rounds 3] [--sizes 10,1000]

Setup (untimed): A (user → country) and B (user → amount) hold ``--records`` users each; the example's
``country_totals`` job brings C up to date and one more round warms the session. Timed, for each size N,
``--rounds`` times: N changed users written into a phantom of A, then

* the preview of that phantom (``Transform.preview``: diffs and phantom changes read on the driver, ``fn``
  run once, its result written into a phantom of C), then
* the same N changes committed to A and the real round that follows (the baseline; a small round, with
  the runner's default driver-side path), timed from the commit's return to the round's commit.

Both on the same session and collections; the preview's view of C is checked against the round's result
each time. Prints the medians and their ratio. The machine is shared and noisy: compare ratios, not
single runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "spark_a_plus_b"))

from _harness import machine, server_thread  # noqa: E402
from job import country_totals  # noqa: E402
from small_rounds import COUNTRIES, commit, user  # noqa: E402

from diffstore.client import Client  # noqa: E402
from diffstore.wire import decode_es  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed previews and rounds per size (median)")
    parser.add_argument("--sizes", default="10,1000", help="changed records per preview")
    args = parser.parse_args()
    print(machine())
    n = args.records

    import uvicorn

    from diffstore import Store
    from diffstore.server import ServerConfig, create_app
    from diffstore.spark import Transform, local_session

    def make_server(port: int) -> uvicorn.Server:
        app = create_app(store, ServerConfig(port=port))
        return uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    with (
        tempfile.TemporaryDirectory() as tmp,
        Store.open(Path(tmp) / "store") as store,
        server_thread(make_server) as served,
    ):
        url = served.url
        spark = local_session("diffstore-bench-preview")
        client = Client(url, timeout_s=120.0)
        for name in ("A", "B", "C"):
            client.create_collection(name, manual=True)
        commit(client, "B", [(user(i), b"%d" % (1 + i % 997)) for i in range(n)])
        commit(client, "A", [(user(i), COUNTRIES[i % len(COUNTRIES)]) for i in range(n)])
        transform = Transform(spark, url, "C", {"a": "A", "b": "B"}, country_totals)
        transform.run()
        a, c = client.collection("A"), client.collection("C")
        step = 0

        def changes(count: int) -> list[tuple[bytes, bytes]]:
            nonlocal step
            step += 1
            return [(user((i * 7919 + step) % n), COUNTRIES[step % 8]) for i in range(count)]

        def measure(count: int) -> tuple[float, float]:
            items = changes(count)
            phantom = a.start_phantom()
            a.put_many(items, generation_id=a.generation_id, phantom_id=phantom)
            t = time.perf_counter()
            preview = transform.preview({"a": phantom})
            previewing = time.perf_counter() - t
            view = {r.key: r.value for r in c.query(phantom_id=decode_es(preview))}
            commit(client, "A", items)
            t = time.perf_counter()
            assert len(transform.run()) == 1
            rounding = time.perf_counter() - t
            assert {r.key: r.value for r in c.query()} == view, "the preview differs from the round"
            return previewing, rounding

        measure(10)  # warm both paths
        print(f"{n:,} users in A and B; country_totals; s (median of {args.rounds}); noisy shared machine")
        for count in (int(s) for s in args.sizes.split(",")):
            previews, rounds = [], []
            for _ in range(args.rounds):
                p, r = measure(count)
                previews.append(p)
                rounds.append(r)
            preview_s, round_s = statistics.median(previews), statistics.median(rounds)
            print(
                f"{count:>7,} changes: preview {preview_s:6.2f}s   real round {round_s:6.2f}s   "
                f"ratio {preview_s / round_s:.2f}x"
            )
        transform.close()
        client.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
