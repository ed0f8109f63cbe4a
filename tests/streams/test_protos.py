"""protos/hstream.proto against upstream: descriptors match hstreamdb-api, generated code is not stale.

Upstream's generated module (``HStream.Server.HStreamApi_pb2``) defines the same symbols as ours, so both
cannot live in one descriptor pool; its FileDescriptorProto is read in a subprocess.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from diffstore.streams._proto import hstream_pb2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gen_protos  # noqa: E402

SPEC_RPCS = {
    "Echo", "DescribeCluster", "LookupShard", "LookupSubscription", "LookupResource", "LookupKey",
    "CreateStream", "DeleteStream", "GetStream", "ListStreams", "ListShards", "Append", "GetTailRecordId",
    "CreateSubscription", "GetSubscription", "ListSubscriptions", "CheckSubscriptionExist",
    "DeleteSubscription", "ListConsumers", "StreamingFetch",
}  # fmt: skip

_DUMP = (
    "import sys\n"
    "from HStream.Server import HStreamApi_pb2 as p\n"
    "from google.protobuf import descriptor_pb2\n"
    "fdp = descriptor_pb2.FileDescriptorProto()\n"
    "p.DESCRIPTOR.CopyToProto(fdp)\n"
    "sys.stdout.buffer.write(fdp.SerializeToString())\n"
)


@pytest.fixture(scope="module")
def upstream() -> descriptor_pb2.FileDescriptorProto:
    out = subprocess.run([sys.executable, "-c", _DUMP], check=True, capture_output=True, timeout=60).stdout
    return descriptor_pb2.FileDescriptorProto.FromString(out)


@pytest.fixture(scope="module")
def ours() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    hstream_pb2.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _messages(
    messages: list[descriptor_pb2.DescriptorProto], prefix: str = ""
) -> dict[str, descriptor_pb2.DescriptorProto]:
    found = {}
    for message in messages:
        name = prefix + message.name
        found[name] = message
        found.update(_messages(list(message.nested_type), name + "."))
    return found


def _enums(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, list[tuple[str, int]]]:
    found = {e.name: [(v.name, v.number) for v in e.value] for e in fdp.enum_type}
    for name, message in _messages(list(fdp.message_type)).items():
        for e in message.enum_type:
            found[f"{name}.{e.name}"] = [(v.name, v.number) for v in e.value]
    return found


def _field_shape(message: descriptor_pb2.DescriptorProto) -> dict[str, tuple[object, ...]]:
    shape = {}
    for f in message.field:
        oneof = message.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
        shape[f.name] = (f.number, f.type, f.label, f.type_name, f.proto3_optional, oneof)
    return shape


def test_package_and_service(ours: descriptor_pb2.FileDescriptorProto) -> None:
    assert ours.package == "hstream.server"
    assert [s.name for s in ours.service] == ["HStreamApi"]
    assert {m.name for m in ours.service[0].method} == SPEC_RPCS


def test_every_message_matches_upstream(
    ours: descriptor_pb2.FileDescriptorProto, upstream: descriptor_pb2.FileDescriptorProto
) -> None:
    assert upstream.package == ours.package
    theirs = _messages(list(upstream.message_type))
    mine = _messages(list(ours.message_type))
    assert {
        "HStreamRecord",
        "HStreamRecordHeader",
        "BatchHStreamRecords",
        "BatchedRecord",
        "RecordId",
    } <= set(mine)
    for name, message in mine.items():
        assert name in theirs, name
        assert _field_shape(message) == _field_shape(theirs[name]), name
        assert message.options.map_entry == theirs[name].options.map_entry, name


def test_every_enum_matches_upstream(
    ours: descriptor_pb2.FileDescriptorProto, upstream: descriptor_pb2.FileDescriptorProto
) -> None:
    theirs = _enums(upstream)
    mine = _enums(ours)
    assert mine["CompressionType"] == [("None", 0), ("Gzip", 1), ("Zstd", 2)]
    assert mine["SpecialOffset"] == [("EARLIEST", 0), ("LATEST", 1)]
    assert mine["HStreamRecordHeader.Flag"] == [("JSON", 0), ("RAW", 1)]
    for name, values in mine.items():
        assert values == theirs[name], name


def test_every_rpc_matches_upstream(
    ours: descriptor_pb2.FileDescriptorProto, upstream: descriptor_pb2.FileDescriptorProto
) -> None:
    theirs = {m.name: m for m in upstream.service[0].method}
    assert upstream.service[0].name == "HStreamApi"
    for method in ours.service[0].method:
        other = theirs[method.name]
        assert (method.input_type, method.output_type) == (other.input_type, other.output_type), method.name
        assert (method.client_streaming, method.server_streaming) == (
            other.client_streaming,
            other.server_streaming,
        ), method.name


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    generated = gen_protos.generate(tmp_path)
    checked_in = ROOT / "diffstore" / "streams" / "_proto"
    assert sorted(p.name for p in generated) == sorted(p.name for p in checked_in.glob("*.py*"))
    for path in generated:
        assert filecmp.cmp(path, checked_in / path.name, shallow=False), (
            f"{path.name} is stale: run make protos"
        )


def test_grpc_module_imports_from_the_package() -> None:
    from diffstore.streams._proto import hstream_pb2_grpc

    assert hstream_pb2_grpc.hstream__pb2 is hstream_pb2
    record = hstream_pb2.RecordId(shardId=3, batchId=2**40, batchIndex=7)
    assert hstream_pb2.RecordId.FromString(record.SerializeToString()) == record
