package server_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// TestBadInput answers malformed calls with errors that name the problem,
// in lenient and strict mode, and keeps serving afterwards.
func TestBadInput(t *testing.T) {
	limits := server.Limits{MaxKeysPerCall: 100, MaxMessageBytes: 1 << 20, MaxParamsBytes: 4096}
	lenient := startEnv(t, envOptions{limits: limits})
	strict := startEnv(t, envOptions{limits: limits, parser: offload.Parser{Mode: offload.Strict}})
	ctx := ctxT(t)
	lc := lenient.dial(t, lenient.unix)
	sc := strict.dial(t, strict.unix)
	api, sapi := lc.API(), sc.API()
	if _, err := lc.NewRequest(ctx, "live", ""); err != nil {
		t.Fatal(err)
	}
	k := []byte(key(1))
	big := bytes.Repeat([]byte{1}, 2<<20)
	manyKeys := make([][]byte, 101)
	for i := range manyKeys {
		manyKeys[i] = k
	}

	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"unknown request id", func() error {
			_, err := api.Lookup(ctx, &kvtierv1.LookupRequest{RequestId: "ghost", Keys: [][]byte{k}})
			return err
		}, codes.NotFound, `unknown request id "ghost"`},
		{"unknown request on complete store", func() error {
			_, err := api.CompleteStore(ctx, &kvtierv1.CompleteStoreRequest{RequestId: "ghost", Keys: [][]byte{k}, Success: true})
			return err
		}, codes.NotFound, `"ghost"`},
		{"unknown namespace", func() error {
			_, err := api.Stats(ctx, &kvtierv1.StatsRequest{Namespace: "llama"})
			return err
		}, codes.NotFound, `unknown namespace "llama"`},
		{"duplicate request id", func() error {
			_, err := api.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "live"})
			return err
		}, codes.AlreadyExists, `"live"`},
		{"empty request id", func() error {
			_, err := api.NewRequest(ctx, &kvtierv1.NewRequestRequest{})
			return err
		}, codes.InvalidArgument, "empty request id"},
		{"key too short", func() error {
			_, err := api.Lookup(ctx, &kvtierv1.LookupRequest{RequestId: "live", Keys: [][]byte{k, []byte("abc")}})
			return err
		}, codes.InvalidArgument, "keys[1]: key too short: 3 bytes"},
		{"key too long", func() error {
			_, err := api.Touch(ctx, &kvtierv1.TouchRequest{RequestId: "live", Keys: [][]byte{bytes.Repeat([]byte("k"), 2000)}})
			return err
		}, codes.InvalidArgument, "key too long: 2000 bytes"},
		{"too many keys", func() error {
			_, err := api.Lookup(ctx, &kvtierv1.LookupRequest{RequestId: "live", Keys: manyKeys})
			return err
		}, codes.ResourceExhausted, "101 keys in one call (max 100)"},
		{"oversized message", func() error {
			_, err := api.PutBlocks(ctx, &kvtierv1.PutBlocksRequest{Blocks: []*kvtierv1.Block{{Key: k, Data: big}}})
			return err
		}, codes.ResourceExhausted, "larger than max"},
		{"params not an object", func() error {
			_, err := api.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "p1", KvTransferParams: "[1, 2]"})
			return err
		}, codes.InvalidArgument, "invalid kv_transfer_params"},
		{"params not JSON", func() error {
			_, err := api.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "p2", KvTransferParams: "{bad"})
			return err
		}, codes.InvalidArgument, "invalid kv_transfer_params"},
		{"params too large", func() error {
			_, err := api.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "p3", KvTransferParams: `{"x": "` + strings.Repeat("a", 5000) + `"}`})
			return err
		}, codes.ResourceExhausted, "kv_transfer_params is 5009 bytes (max 4096)"},
		{"strict: filter not a list", func() error {
			_, err := sapi.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "s1", KvTransferParams: `{"kv_load_tiers": "storage"}`})
			return err
		}, codes.InvalidArgument, "kv_load_tiers: expected a list"},
		{"strict: unknown medium", func() error {
			_, err := sapi.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "s2", KvTransferParams: `{"kv_store_tiers": [{"medium": "disk"}]}`})
			return err
		}, codes.InvalidArgument, `kv_store_tiers[0]: unknown medium "disk"`},
		{"block of the wrong size", func() error {
			_, err := api.PutBlocks(ctx, &kvtierv1.PutBlocksRequest{Blocks: []*kvtierv1.Block{{Key: k, Data: []byte("short")}}})
			return err
		}, codes.InvalidArgument, "blocks[0]: data is 5 bytes, slot size is 256"},
		{"duplicate block", func() error {
			d := make([]byte, slotSize)
			_, err := api.PutBlocks(ctx, &kvtierv1.PutBlocksRequest{Blocks: []*kvtierv1.Block{{Key: k, Data: d}, {Key: k, Data: d}}})
			return err
		}, codes.InvalidArgument, "repeats blocks[0]"},
		{"load of an absent key", func() error {
			_, err := api.PrepareLoad(ctx, &kvtierv1.PrepareLoadRequest{RequestId: "live", Keys: [][]byte{[]byte(key(999))}})
			return err
		}, codes.FailedPrecondition, "prepare load"},
		{"complete load without a pin", func() error {
			d := make([]byte, slotSize)
			if _, err := api.PutBlocks(ctx, &kvtierv1.PutBlocksRequest{Blocks: []*kvtierv1.Block{{Key: []byte(key(7)), Data: d}}}); err != nil {
				return err
			}
			_, err := api.CompleteLoad(ctx, &kvtierv1.CompleteLoadRequest{RequestId: "live", Keys: [][]byte{[]byte(key(7))}})
			return err
		}, codes.FailedPrecondition, "is not pinned by request \"live\""},
		{"complete store of a key not reserved", func() error {
			_, err := api.CompleteStore(ctx, &kvtierv1.CompleteStoreRequest{RequestId: "live", Keys: [][]byte{[]byte(key(7))}, Success: true})
			return err
		}, codes.FailedPrecondition, "was not reserved for request \"live\""},
		{"metadata count mismatch", func() error {
			_, err := api.PrepareStore(ctx, &kvtierv1.PrepareStoreRequest{RequestId: "live", Keys: [][]byte{k, []byte(key(2))}, Metadata: []*kvtierv1.BlockMetadata{{}}})
			return err
		}, codes.InvalidArgument, "1 metadata entries for 2 keys"},
		{"finish twice", func() error {
			if _, err := api.NewRequest(ctx, &kvtierv1.NewRequestRequest{RequestId: "twice"}); err != nil {
				return err
			}
			if _, err := api.FinishRequest(ctx, &kvtierv1.FinishRequestRequest{RequestId: "twice"}); err != nil {
				return err
			}
			_, err := api.FinishRequest(ctx, &kvtierv1.FinishRequestRequest{RequestId: "twice"})
			return err
		}, codes.NotFound, `"twice"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			wantCode(t, err, tc.code, tc.msg)
		})
	}

	// Lenient mode accepts the same filters with warnings.
	nr, err := lc.NewRequest(ctx, "l1", `{"kv_load_tiers": "storage", "kv_store_tiers": [{"medium": "disk"}, {"medium": "cpu"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if !nr.GetLoadFilter().GetAll() || len(nr.GetStoreFilter().GetMatchers()) != 1 || len(nr.GetWarnings()) != 2 {
		t.Fatalf("lenient parse: %v", nr)
	}
	if nr.GetWarnings()[1].GetReason() != offload.ReasonUnknownMedium || nr.GetWarnings()[1].GetEntry() != 0 {
		t.Fatalf("warning: %v", nr.GetWarnings()[1])
	}
	// Explain in strict mode reports the error without failing.
	ex, err := sc.Explain(ctx, `{"kv_load_tiers": [{"locality": "moon"}]}`)
	if err != nil || !strings.Contains(ex.GetStrictError(), "unknown locality") || ex.GetValidationMode() != "strict" {
		t.Fatalf("strict explain: %v %v", ex, err)
	}

	garbage(t, lenient.unix, "unix")
	garbage(t, lenient.tcp, "tcp")
	garbage(t, lenient.unix+".arena", "unix")

	// The side channel answers an unknown namespace with an error.
	if _, err := client.ReceiveArenaFD(ctx, lenient.unix+".arena", "llama", ""); err == nil || !strings.Contains(err.Error(), `unknown namespace "llama"`) {
		t.Fatalf("side channel, unknown namespace: %v", err)
	}

	// Still serving.
	for _, c := range []*client.Client{lc, sc, lenient.dial(t, lenient.tcp)} {
		if _, err := c.Stats(ctx); err != nil {
			t.Fatalf("daemon stopped answering: %v", err)
		}
	}
}

// garbage writes junk to a listener and reads until the server hangs up
// (or a short deadline passes).
func garbage(t *testing.T, addr, network string) {
	t.Helper()
	junk := make([]byte, 4096)
	rand.Read(junk)
	for _, payload := range [][]byte{
		junk,
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		[]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\xff\x04\x00\x00\x00\x00\x00garbage"),
		bytes.Repeat([]byte("x"), 1<<16), // no newline for the side channel
	} {
		c, err := net.DialTimeout(network, addr, time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		c.Write(payload)
		io.Copy(io.Discard, c)
		c.Close()
	}
}

// TestGetBlocksMessageLimit refuses a GetBlocks whose answer could exceed
// the message limit.
func TestGetBlocksMessageLimit(t *testing.T) {
	e := startEnv(t, envOptions{limits: server.Limits{MaxMessageBytes: 1 << 16}})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	_, err := c.GetBlocks(ctx, keys(0, 300), client.GetOptions{})
	wantCode(t, err, codes.ResourceExhausted, "message limit")
}
