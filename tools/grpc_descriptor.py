"""`python -m tools.grpc_descriptor` (make grpc-descriptor): server/grpc/proto/tei.binpb, the descriptor
server/grpc/messages.py builds TEI's messages from, made anew from tei.proto with grpcio-tools' protoc."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

PROTO = Path(__file__).parent.parent / "server" / "grpc" / "proto" / "tei.proto"
DESCRIPTOR = PROTO.with_suffix(".binpb")


def compiled_descriptor(proto: Path = PROTO) -> bytes:
    """The FileDescriptorProto protoc makes of `proto` (no source info: comments leave no trace), serialized."""
    from grpc_tools import protoc  # the build tool, in the `grpc` and `dev` extras

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        if protoc.main(["protoc", f"-I{proto.parent}", f"--descriptor_set_out={out}", proto.name]) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return bytes(files[0].SerializeToString(deterministic=True))


if __name__ == "__main__":
    DESCRIPTOR.write_bytes(compiled_descriptor())
    print(f"wrote {DESCRIPTOR}", file=sys.stderr)
