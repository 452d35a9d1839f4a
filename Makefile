# Thin wrappers; scripts/test.sh is the source of truth for testing.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: test build explain

# The whole suite, exactly what CI runs (.ci/run).
test:
	./scripts/test.sh

# bin/ is gitignored.
build:
	go build -ldflags "-X main.version=$(VERSION)" -o bin/kvtier ./cmd/kvtier

explain:
	go run ./cmd/kvtier explain --config examples/explain.yaml --params '{"kv_load_tiers":[{"medium":"storage"}]}'
