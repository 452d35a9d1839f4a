#!/bin/sh
# Regenerates the committed Go and Python code of the kvtier API from
# api/kvtier/v1/kvtier.proto. Run from anywhere: sh api/gen.sh
#
# Needs: protoc and grpc_python_plugin (Debian: protobuf-compiler,
# protobuf-compiler-grpc), and the pinned Go plugins, installed into the
# gitignored .tools/bin on first use:
#   protoc-gen-go v1.36.12, protoc-gen-go-grpc v1.6.2
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
mkdir -p "$bin"
if [ ! -x "$bin/protoc-gen-go" ]; then
	GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
fi
if [ ! -x "$bin/protoc-gen-go-grpc" ]; then
	GOBIN="$bin" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
fi
for tool in protoc grpc_python_plugin; do
	command -v "$tool" >/dev/null || {
		echo "gen.sh: $tool not found (apt-get install protobuf-compiler protobuf-compiler-grpc)" >&2
		exit 1
	}
done

cd "$root/api"
PATH="$bin:$PATH" protoc --proto_path=. \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	kvtier/v1/kvtier.proto

# Python: module kvtier.v1.kvtier_pb2 inside the python/kvtier package,
# with its type stub (kvtier_pb2.pyi) for mypy.
protoc --proto_path=. \
	--python_out="$root/python" \
	--pyi_out="$root/python" \
	--grpc_python_out="$root/python" \
	--plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
	kvtier/v1/kvtier.proto
