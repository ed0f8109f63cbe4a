"""Generate diffstore/streams/_proto from protos/hstream.proto with grpc_tools.protoc, reproducibly.

Usage: ``python scripts/gen_protos.py [--out DIR]`` (default: the checked-in package). The grpc module's
import of the message module is rewritten to an absolute package import so that
``from diffstore.streams._proto import hstream_pb2_grpc`` works. tests/streams/test_protos.py regenerates
into a temporary directory and fails if the checked-in files differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PROTO = PROTO_DIR / "hstream.proto"
DEFAULT_OUT = ROOT / "diffstore" / "streams" / "_proto"
PACKAGE = "diffstore.streams._proto"
GENERATED = ("__init__.py", "hstream_pb2.py", "hstream_pb2.pyi", "hstream_pb2_grpc.py")
INIT_TEXT = '"""Generated from protos/hstream.proto by scripts/gen_protos.py; do not edit."""\n'


def generate(out: Path) -> list[Path]:
    """Run protoc into ``out`` and fix the generated imports.

    Args:
        out: the target directory (created if missing).

    Returns:
        The generated files.

    Raises:
        RuntimeError: protoc failed.
    """
    from grpc_tools import protoc  # a dev dependency, imported only when generating

    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO),
    ]
    if protoc.main(argv) != 0:
        raise RuntimeError("protoc failed on " + str(PROTO))
    grpc_module = out / "hstream_pb2_grpc.py"
    text = grpc_module.read_text()
    fixed = text.replace(
        "import hstream_pb2 as hstream__pb2", f"from {PACKAGE} import hstream_pb2 as hstream__pb2"
    )
    if fixed == text:
        raise RuntimeError("generated grpc module no longer imports hstream_pb2 the expected way")
    grpc_module.write_text(fixed)
    stub = out / "hstream_pb2.pyi"
    # ``CompressionType.None`` is a Python keyword, so the stub cannot declare it (use ``Value("None")``).
    lines = stub.read_text().splitlines(keepends=True)
    stub.write_text("".join(line for line in lines if not line.lstrip().startswith("None:")))
    (out / "__init__.py").write_text(INIT_TEXT)
    return [out / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
