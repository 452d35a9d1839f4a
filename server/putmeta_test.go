package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// storedEvents subscribes to e's publisher and returns a function that
// receives the next n BlockStored events (maps, as a router decodes them).
func storedEvents(t *testing.T, e *env) func(n int) []map[string]any {
	t.Helper()
	ctx := ctxT(t)
	sub, err := zmtp.Dial(ctx, "tcp://"+e.pub.Addr().String(), zmtp.Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	if err := sub.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	waitSubscribed(t, e.pub)
	return func(n int) []map[string]any {
		t.Helper()
		var out []map[string]any
		for len(out) < n {
			frames, err := sub.Recv()
			if err != nil {
				t.Fatal(err)
			}
			var batch []any
			if err := msgpack.Unmarshal(frames[2], &batch); err != nil {
				t.Fatal(err)
			}
			evs, _ := batch[1].([]any)
			for _, ev := range evs {
				if m, _ := ev.(map[string]any); m["type"] == "BlockStored" {
					out = append(out, m)
				}
			}
		}
		return out
	}
}

func waitSubscribed(t *testing.T, pub *events.Publisher) {
	t.Helper()
	rt.Eventually(t, 30*time.Second, "the subscriber registered", func() bool {
		st := pub.Stats()
		return len(st.Subscribers) > 0 && st.Subscribers[0].Subscriptions > 0
	})
}

// tokensOf is the metadata of a one-hash-block chunk: its key's hash and
// four tokens from first.
func tokensOf(k offload.Key, first int64) *kvtierv1.BlockMetadata {
	return &kvtierv1.BlockMetadata{BlockHashes: [][]byte{[]byte(k.Hash())}, TokenIds: []int64{first, first + 1, first + 2, first + 3}, BlockSize: 4}
}

// PutBlocks carries token metadata on every path — the API over the Unix
// socket and TCP, the block stream — into self-describing events, and
// refuses metadata that does not describe its key alike on every path,
// the stream staying usable.
func TestPutBlocksMetadataOnEveryPath(t *testing.T) {
	for _, path := range byValuePaths {
		t.Run(path, func(t *testing.T) {
			e := startEnv(t, envOptions{slots: 16, tiers: noTiers, stream: true, publish: true,
				tracker: events.TrackerConfig{SelfDescribing: true}})
			next := storedEvents(t, e)
			c := e.dialVia(t, path)
			ctx := ctxT(t)
			k0, k1 := key(1), key(2)
			_, err := c.PutBlocks(ctx, []client.Block{{Key: k0, Data: block(k0), Meta: tokensOf(k1, 5)}}, client.CallOptions{})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "last block hash") {
				t.Fatalf("metadata of another key: %v, want InvalidArgument", err)
			}
			stored, err := c.PutBlocks(ctx, []client.Block{{Key: k0, Data: block(k0), Meta: tokensOf(k0, 5)}, {Key: k1, Data: block(k1)}}, client.CallOptions{})
			if err != nil || !stored[0] || !stored[1] {
				t.Fatalf("put: %v %v", stored, err)
			}
			evs := next(2)
			if toks, _ := evs[0]["token_ids"].([]any); len(toks) != 4 {
				t.Errorf("the block with metadata: %v, want its 4 tokens", evs[0])
			}
			if toks, _ := evs[1]["token_ids"].([]any); len(toks) != 0 {
				t.Errorf("the block without: %v, want a placeholder", evs[1])
			}
			if path == "tcp-stream" {
				// The daemon counts a stream request after it answered it.
				want := []string{`kvtier_stream_requests_total{kind="put_blocks",result="ok"} 1`, `kvtier_stream_requests_total{kind="put_blocks",result="failed"} 1`}
				m := scrapeUntil(t, e, func(m string) bool { return strings.Contains(m, want[0]) && strings.Contains(m, want[1]) })
				if !strings.Contains(m, want[0]) || !strings.Contains(m, want[1]) {
					t.Errorf("the puts did not take the stream:\n%s", grepLines(m, "kvtier_stream_requests"))
				}
			}
		})
	}
}

// A tenant's put with its engine's tokens publishes them: under its
// space's hashes, with its salt on the request's first chunk — on the
// API and on the stream.
func TestTenantPutBlocksMetadata(t *testing.T) {
	acme, _ := keyspace.Tenant("acme")
	for _, stream := range []bool{false, true} {
		e := startEnv(t, envOptions{slots: 16, token: "admin-token", tiers: noTiers, stream: stream, publish: true,
			tenants: []server.TenantConfig{{Name: "acme", Token: "acme-token", Namespaces: []string{""}}},
			tracker: events.TrackerConfig{SelfDescribing: true, Spaces: map[uint64]string{acme.ID(): "acme's salt"}}})
		next := storedEvents(t, e)
		c := e.dialAs(t, "acme-token", "")
		k0, k1 := key(1), key(2)
		m1 := tokensOf(k1, 9)
		m1.ParentBlockHash = []byte(k0.Hash())
		if _, err := c.PutBlocks(ctxT(t), []client.Block{{Key: k0, Data: block(k0), Meta: tokensOf(k0, 5)}, {Key: k1, Data: block(k1), Meta: m1}}, client.CallOptions{}); err != nil {
			t.Fatal(err)
		}
		evs := next(2)
		wire := func(k offload.Key) uint64 { return offload.WireHash(events.SpaceHash(acme.ID(), k.Hash())) }
		hashOf := func(ev map[string]any) uint64 {
			hs, _ := ev["block_hashes"].([]any)
			if len(hs) != 1 {
				t.Fatalf("event %v", ev)
			}
			return toU64(hs[0])
		}
		if hashOf(evs[0]) != wire(k0) || hashOf(evs[1]) != wire(k1) || toU64(evs[1]["parent_block_hash"]) != wire(k0) {
			t.Errorf("stream %v: hashes %v, want acme's space hashes", stream, evs)
		}
		ek, _ := evs[0]["extra_keys"].([]any)
		if len(ek) != 1 || evs[1]["extra_keys"] != nil {
			t.Errorf("stream %v: extra_keys %v and %v, want the salt on the first chunk only", stream, evs[0]["extra_keys"], evs[1]["extra_keys"])
		} else if salt, _ := ek[0].([]any); len(salt) != 1 || salt[0] != "acme's salt" {
			t.Errorf("stream %v: salt %v", stream, ek[0])
		}
	}
}

func toU64(v any) uint64 {
	switch n := v.(type) {
	case uint64:
		return n
	case int64:
		return uint64(n)
	case uint32:
		return uint64(n)
	case int8:
		return uint64(n)
	case uint8:
		return uint64(n)
	case uint16:
		return uint64(n)
	case int16:
		return uint64(n)
	case int32:
		return uint64(n)
	}
	return 0
}
