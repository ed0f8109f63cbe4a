"""What checking every appended batch costs the embedded stream server (issue 13).

    .venv/bin/python benchmarks/append_check.py [--batches 300] [--records 1000]

Append decodes each batch (bounded decompression, parse, count) before storing it. For batches of
``--records`` 100-byte records in each compression, this prints the median time of that check alone and of
a whole Append RPC of the same batch against an embedded server in this process (loopback gRPC, unsynced
LMDB), and the check's share of the Append. The machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import zstandard
from _harness import machine

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.server import ServerThread, StreamServerConfig
from diffstore.streams.server.codec import check_batch


def make_batch(records: int, compression: int) -> pb.BatchedRecord:
    raw = pb.BatchHStreamRecords(
        records=[pb.HStreamRecord(payload=(b"%08d" % i).ljust(100, b"v")) for i in range(records)]
    ).SerializeToString()
    if compression == 1:
        raw = gzip.compress(raw, 1)
    elif compression == 2:
        raw = zstandard.ZstdCompressor().compress(raw)
    return pb.BatchedRecord(compressionType=compression, batchSize=records, payload=raw)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        config = StreamServerConfig(data_dir=Path(tmp), port=0, sync=False)
        with ServerThread(config) as server, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.HStreamApiStub(channel)
            stub.CreateStream(pb.Stream(streamName="s", replicationFactor=1, shardCount=1))
            shard = stub.ListShards(pb.ListShardsRequest(streamName="s")).shards[0].shardId
            print(
                f"batches of {args.records} records of 100 B, median of {args.batches} (noisy shared machine)"
            )
            for compression, name in ((0, "none"), (1, "gzip"), (2, "zstd")):
                record = make_batch(args.records, compression)
                request = pb.AppendRequest(streamName="s", shardId=shard, records=record)
                checks, appends = [], []
                for _ in range(args.batches):
                    start = time.perf_counter()
                    check_batch(record, config.max_batch_records, config.max_batch_bytes)
                    checks.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    stub.Append(request)
                    appends.append(time.perf_counter() - start)
                check, append = statistics.median(checks), statistics.median(appends)
                print(
                    f"  {name:4s}: check {check * 1e6:8.1f} us   whole Append RPC {append * 1e6:8.1f} us   "
                    f"check / Append {check / append:5.2f}"
                )


if __name__ == "__main__":
    main()
