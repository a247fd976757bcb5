"""TEI's messages, built from the vendored proto's descriptor (proto/tei.binpb) in a descriptor pool of
their own: no generated Python is committed, and a client generated from TEI's proto can live in the
same process (its classes take the default pool, where the same names would clash).

`python -m tools.grpc_descriptor` (make grpc-descriptor) writes the descriptor anew from proto/tei.proto
with grpcio-tools; tests/unit/test_grpc_descriptor.py fails while the two disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = Path(__file__).parent / "proto" / "tei.proto"
DESCRIPTOR = PROTO.with_suffix(".binpb")
PACKAGE = "tei.v1"

pool = descriptor_pool.DescriptorPool()
file_descriptor = pool.Add(descriptor_pb2.FileDescriptorProto.FromString(DESCRIPTOR.read_bytes()))
SERVICES = file_descriptor.services_by_name


def message(name: str) -> Any:
    """The class of tei.v1.<name>."""
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
