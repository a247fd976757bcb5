"""TEI's gRPC API (its tei.proto) on WARMPOOL_GRPC_PORT, inside the HTTP process and on its event
loop: each RPC goes through the pooling routes' own pipeline (server/core/pipeline.py), so admission,
priority, limits, metrics and tracing are the HTTP routes'. Imported only when the port is set."""
