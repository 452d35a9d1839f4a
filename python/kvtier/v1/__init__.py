"""Generated protobuf and gRPC stubs of the kvtier v1 API (see api/gen.sh)."""
