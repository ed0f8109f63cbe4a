"""Metrics with several server processes over one store: prometheus_client's multiprocess mode.

Two ``diffstore serve --workers 1`` processes share a data directory and a metrics directory (what the
supervisor of ``serve --workers N`` sets up): a scrape of either counts the work of both, deterministically.
Then ``serve --workers 2`` itself: its workers' counts add up in every scrape, and its directory goes away.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diffstore.server import metrics
from tests.helpers import free_port, wait_until


def _without_token(env: Mapping[str, str]) -> dict[str, str]:
    """The environment without ``DIFFSTORE_TOKEN`` (an empty one is refused: it never turns auth off)."""
    return {name: value for name, value in env.items() if name != "DIFFSTORE_TOKEN"}


def _value(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    saved = os.environ.get(metrics.MULTIPROC_ENV)
    directory = metrics.prepare_multiprocess(str(tmp_path / "metrics"))
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(2):
            port = free_port()
            command = [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(tmp_path / "data"),
                       "--port", str(port), "--log-level", "warning", "--workers", "1"]  # fmt: skip
            processes.append(subprocess.Popen(command, env=_without_token(os.environ)))
            url = f"http://127.0.0.1:{port}"

            def healthy(url: str = url) -> bool:
                try:
                    return httpx.get(f"{url}/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(healthy, 30, what="a worker to start")
            urls.append(url)
        yield urls[0], urls[1]
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            metrics.worker_exited(process.pid)
        metrics.cleanup_multiprocess(directory)
        if saved is not None:
            os.environ[metrics.MULTIPROC_ENV] = saved
    assert not Path(directory).exists()


def test_a_scrape_of_one_worker_counts_the_work_of_every_worker(two_workers: tuple[str, str]) -> None:
    a, b = two_workers
    assert httpx.post(f"{a}/collections/", json={"collectionName": "m", "isManual": True}).status_code == 200
    for generation in ("g1", "g2"):
        gen = {"value": generation}
        assert (
            httpx.post(f"{a}/collections/m/generation/start", json={"generationId": gen}).status_code == 200
        )
        items = [{"key": {"value": "k"}, "value": {"value": generation}}]
        put = httpx.post(f"{a}/collections/m/putMany", json={"generationId": gen, "items": items})
        assert put.status_code == 200
        assert (
            httpx.post(f"{a}/collections/m/generation/commit", json={"generationId": gen}).status_code == 200
        )
    assert httpx.get(f"{b}/collections/m").status_code == 200
    # worker B answers for both: A's commits and writes, B's own request
    assert _value(b, "diffstore_commits_total", collection="m") == 2
    assert _value(b, "diffstore_records_written_total", collection="m") == 2
    route = {"route": "/collections/{c}", "method": "GET", "status": "200"}
    assert _value(a, "diffstore_http_requests_total", **route) == 1
    created = {"route": "/collections", "method": "POST", "status": "200"}
    assert _value(b, "diffstore_http_requests_total", **created) == 1
    # a long poll waiting on worker B shows in a scrape of worker A, and goes when A commits
    answers: list[int] = []

    def poll() -> None:
        params = {"generationId": "g2", "timeoutMs": "30000"}
        answers.append(
            httpx.get(f"{b}/collections/m/generationId/stream", params=params, timeout=60).status_code
        )

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        wait_until(lambda: _value(a, "diffstore_longpoll_waiters") == 1, 10, what="B's waiter in A's scrape")
        gen = {"value": "g3"}
        assert (
            httpx.post(f"{a}/collections/m/generation/start", json={"generationId": gen}).status_code == 200
        )
        assert (
            httpx.post(f"{a}/collections/m/generation/commit", json={"generationId": gen}).status_code == 200
        )
        wait_until(lambda: answers == [200], 10, what="the long poll on B to be answered by A's commit")
        wait_until(lambda: _value(a, "diffstore_longpoll_waiters") == 0, 10, what="the waiter to go")
    finally:
        thread.join(timeout=60)


def test_a_deleted_collections_series_leave_every_workers_scrape(two_workers: tuple[str, str]) -> None:
    a, b = two_workers
    for name, worker in (("gone", a), ("kept", b)):
        created = httpx.post(f"{worker}/collections/", json={"collectionName": name, "isManual": False})
        assert created.status_code == 200
        item = {"item": {"key": {"value": "k"}, "value": {"value": "v"}}}
        assert httpx.post(f"{worker}/collections/{name}/put", json=item).status_code == 200
    for worker in (a, b):
        for name in ("gone", "kept"):
            wait_until(
                lambda w=worker, n=name: _value(w, "diffstore_commits_total", collection=n) == 1,  # type: ignore[misc]
                30,
                what="the automatic commits to be counted",
            )
    assert httpx.delete(f"{b}/collections/gone").status_code == 200  # A wrote it, B deletes it
    for worker in (a, b):
        text = httpx.get(f"{worker}/metrics").text
        assert 'collection="gone"' not in text
        assert _value(worker, "diffstore_records_written_total", collection="kept") == 1


def test_serve_with_two_workers_sums_them_in_every_scrape(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(tmp_path / "data"), "--port",
               str(port), "--workers", "2", "--log-level", "warning"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != metrics.MULTIPROC_ENV}
    process = subprocess.Popen(command, env={**_without_token(env), "TMPDIR": str(tmp_path)})
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 60, what="the workers to start")
        directories = list(tmp_path.glob("diffstore-metrics-*"))
        assert len(directories) == 1, directories
        directory = directories[0]
        requests = 0

        def both_workers_counted() -> bool:
            nonlocal requests
            # a new connection each time: the kernel hands connections to either worker
            assert httpx.get(f"{url}/collections/").status_code == 200
            requests += 1
            return len(list(directory.glob("counter_*.db"))) >= 2

        wait_until(both_workers_counted, 60, what="requests served by both workers")
        route = {"route": "/collections", "method": "GET", "status": "200"}
        for _ in range(4):  # whichever worker answers the scrape counts every worker's requests
            assert _value(url, "diffstore_http_requests_total", **route) == requests
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert not list(tmp_path.glob("diffstore-metrics-*")), "the supervisor removes its metrics directory"
