"""What HTTPS costs against plain HTTP: a point ``get`` and a 1,000-item diff page, over keep-alive.

    .venv/bin/python benchmarks/tls.py [--gets 2000] [--pages 200] [--rounds 5]

Two ``diffstore serve --workers 1`` processes over one data directory (a private CA and a server
certificate made with openssl at the start), one plain, one with ``--tls-cert/--tls-key``; one
:class:`diffstore.client.Client` each, so every request after the first reuses its connection (the
handshake is paid once, as by any long-lived client). Each round times N point gets, then M diff pages
of 1,000 items, against both servers in turn; printed: the p50 latency of each over all rounds and its
ratio to plain HTTP measured in the same run (goals: get <= 1.3x, diff page <= 1.2x). The machine is
shared with other jobs: figures move between runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import free_port, machine, median, ratio_line, stop, wait_for  # noqa: E402

from diffstore.client import Client  # noqa: E402
from tests.helpers import make_certificates  # noqa: E402

DIFF_ITEMS = 1_000


def start(data: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(data), "--port", str(port)]
    process = subprocess.Popen([*command, "--workers", "1", "--log-level", "warning", *args])
    return process, port


def timed(action: object, n: int) -> list[float]:
    """Microseconds of each of ``n`` calls of ``action``."""
    assert callable(action)
    times = []
    for _ in range(n):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gets", type=int, default=2_000, help="point gets per round and server")
    parser.add_argument("--pages", type=int, default=200, help="diff pages per round and server")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        certs = make_certificates(root / "certs")
        data = root / "data"
        plain, plain_port = start(data)
        secure, secure_port = start(
            data, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)
        )
        try:
            plain_client = Client(f"http://127.0.0.1:{plain_port}")
            tls_client = Client(f"https://127.0.0.1:{secure_port}", ca_file=str(certs.ca))
            wait_for(plain_client.healthz, "the plain server", process=plain)
            wait_for(tls_client.healthz, "the TLS server", process=secure)
            collection = plain_client.create_collection("c")
            collection.write_generation(b"g1", [(b"key-%06d" % i, b"v" * 100) for i in range(DIFF_ITEMS)])
            clients = {"http": plain_client, "https": tls_client}
            gets: dict[str, list[float]] = {"http": [], "https": []}
            pages: dict[str, list[float]] = {"http": [], "https": []}
            for round_ in range(args.rounds):
                # alternate which server goes first: neither always gets the warmer caches
                order = list(clients.items()) if round_ % 2 == 0 else list(reversed(clients.items()))
                for scheme, client in order:
                    c = client.collection("c")
                    assert len(c.diff_page(b"", b"g1", limit=DIFF_ITEMS).items) == DIFF_ITEMS
                    gets[scheme] += timed(lambda c=c: c.get(b"key-000500"), args.gets)
                    pages[scheme] += timed(lambda c=c: c.diff_page(b"", b"g1", limit=DIFF_ITEMS), args.pages)
            get_plain, get_tls = median(gets["http"]), median(gets["https"])
            page_plain, page_tls = median(pages["http"]), median(pages["https"])
            print(f"p50 over {args.rounds} rounds; baseline: the same requests over plain http, same run")
            print(ratio_line("point get over https", get_tls, get_plain, "us", "goal <= 1.3"))
            print(ratio_line(f"diff page of {DIFF_ITEMS:,}", page_tls, page_plain, "us", "goal <= 1.2"))
            plain_client.close()
            tls_client.close()
        finally:
            stop(plain)
            stop(secure)


if __name__ == "__main__":
    main()
