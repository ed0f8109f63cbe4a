"""Every RPC of the embedded stream server fed random bytes over real gRPC (hypothesis, bounded).

Bytes that do not decode as the RPC's request must answer INVALID_ARGUMENT; bytes that happen to decode
get an answer of the protocol (OK or a client-error status), never INTERNAL, UNKNOWN or UNIMPLEMENTED; the
server keeps answering throughout. The number of inputs tried is printed (``pytest -s``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server_hardening import raw_call

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.server import ServerThread, StreamServerConfig

EXAMPLES_PER_METHOD = 100
ANSWERS_OF_DECODABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
}


def _decodes(method: Any, raw: bytes) -> bool:
    try:
        message_factory.GetMessageClass(method.input_type).FromString(raw)
    except Exception:
        return False
    return True


# random bytes, and valid requests with random bytes appended or cut short (closer to the parser's edges)
_VALID_PREFIXES = [
    pb.Stream(streamName="s", replicationFactor=1, shardCount=2).SerializeToString(),
    pb.AppendRequest(
        streamName="s", records=pb.BatchedRecord(batchSize=1, payload=b"\x0a\x02\x12\x00")
    ).SerializeToString(),
    pb.StreamingFetchRequest(subscriptionId="sub", consumerName="c").SerializeToString(),
]
INPUTS = st.one_of(
    st.binary(max_size=300),
    st.tuples(st.sampled_from(_VALID_PREFIXES), st.binary(max_size=40)).map(lambda t: t[0] + t[1]),
    st.tuples(st.sampled_from(_VALID_PREFIXES), st.integers(0, 40)).map(lambda t: t[0][: t[1]]),
)


def _fuzz_one(channel: grpc.Channel, method: Any, tried: dict[str, int]) -> None:
    @settings(
        max_examples=EXAMPLES_PER_METHOD,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(raw=INPUTS)
    def fuzz(raw: bytes) -> None:
        code = raw_call(channel, method, raw)
        if _decodes(method, raw):
            tried["decodable"] += 1
            assert code in ANSWERS_OF_DECODABLE, (method.name, raw, code)
        else:
            tried["undecodable"] += 1
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method.name, raw, code)

    fuzz()


def test_every_method_fed_random_bytes_answers_invalid_argument_and_stays_up(tmp_path: Path) -> None:
    config = StreamServerConfig(
        data_dir=tmp_path / "hstream", port=0, resend_tick=0.005, assignment_interval=0.01, sync=False
    )
    methods = list(pb.DESCRIPTOR.services_by_name["HStreamApi"].methods)
    tried = {"undecodable": 0, "decodable": 0}
    with ServerThread(config) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.HStreamApiStub(channel)
        stub.CreateStream(pb.Stream(streamName="s", replicationFactor=1, shardCount=2))
        stub.CreateSubscription(
            pb.Subscription(subscriptionId="sub", streamName="s", ackTimeoutSeconds=60, maxUnackedRecords=100)
        )
        for method in methods:
            _fuzz_one(channel, method, tried)
            assert stub.Echo(pb.EchoRequest(msg="alive")).msg == "alive", method.name
    total = tried["undecodable"] + tried["decodable"]
    print(
        f"\nstream server fuzz: {total} inputs over {len(methods)} methods "
        f"({tried['undecodable']} undecodable -> INVALID_ARGUMENT, {tried['decodable']} decodable)"
    )
    assert tried["undecodable"] > len(methods)  # the inputs did exercise the refusal
