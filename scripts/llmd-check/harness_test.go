// Package llmdcheck runs llm-d-kv-cache's own event adapter, pool, token
// processor and index against a real kvtier daemon with tenants (issue
// 47): see run.sh.
package llmdcheck

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/blockhash"
	"github.com/kvtier/kvtier/client"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
)

const (
	blockSize = 16
	model     = "llama"
)

// errorSink counts the errors llm-d logs (a batch it cannot parse, an
// event it cannot index, a parent it cannot find) and drops the rest.
type errorSink struct {
	n    *atomic.Int64
	last *atomic.Value
}

func (errorSink) Init(logr.RuntimeInfo)            {}
func (errorSink) Enabled(int) bool                 { return false }
func (errorSink) Info(int, string, ...any)         {}
func (s errorSink) WithValues(...any) logr.LogSink { return s }
func (s errorSink) WithName(string) logr.LogSink   { return s }
func (s errorSink) Error(err error, msg string, kv ...any) {
	s.n.Add(1)
	s.last.Store(fmt.Sprintf("%s: %v %v", msg, err, kv))
}

// space is one key space as its clients and a router see it.
type space struct {
	name   string
	token  string // "" = the admin on the Unix socket
	ns     string // the API namespace ("" = the daemon's own)
	salt   string // "" = none (the daemon's own space)
	stores []int  // the prompts it stores
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startDaemon(t *testing.T, dir string, port int) {
	bin := os.Getenv("KVTIER_BIN")
	if bin == "" {
		t.Fatal("KVTIER_BIN is not set")
	}
	cfg := fmt.Sprintf(`
namespace: {model: %s, bytes_per_block: 4KiB}
primary: {bytes: 4MiB}
secondary_tiers:
  - {name: disk, type: fs, root_dir: %s/data, locality: local}
events: {enabled: true, endpoint: "tcp://127.0.0.1:%d", mode: bind, self_describing: true, positional: true}
tenants:
  - {name: acme, token: acme-token-0123456789, namespaces: [default]}
  - {name: beta, token: beta-token-0123456789, namespaces: [default], event_salt: "beta's salt"}
shared_spaces:
  - {name: docs, tenants: [acme, beta]}
server: {unix_socket: %s/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s}
`, model, dir, port, dir)
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", path)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "kvtier API listening") {
				close(ready)
				break
			}
		}
		for sc.Scan() {
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("kvtier serve did not start")
	}
}

// eventually polls cond every 50 ms for up to 30 s: the pool indexes
// asynchronously and says nothing when it is done.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = cond(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

func TestTenantsRouteWithLLMD(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	port := freePort(t)
	startDaemon(t, dir, port)

	var errs atomic.Int64
	var last atomic.Value
	ctx, cancel := context.WithCancel(log.IntoContext(context.Background(), logr.New(errorSink{&errs, &last})))
	defer cancel()
	index, err := kvblock.NewInMemoryIndex(kvblock.DefaultInMemoryIndexConfig())
	if err != nil {
		t.Fatal(err)
	}
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	pool := kvevents.NewPool(&kvevents.Config{Concurrency: 2, TopicFilter: "kv@"}, index, tp, engineadapter.NewVLLMAdapter())
	pool.Start(ctx)
	subs := kvevents.NewSubscriberManager(pool)
	if err := subs.EnsureSubscriber(ctx, "kvtier-node", fmt.Sprintf("tcp://127.0.0.1:%d", port), "kv@", true); err != nil {
		t.Fatal(err)
	}
	defer subs.Shutdown(ctx)

	// Prompts of 4 chunks: 1 shares its first two with 0, 2 shares none.
	prompts := make([][]int64, 3)
	for p := range prompts {
		for i := 0; i < 4*blockSize; i++ {
			v := int64(1000*p + i)
			if p == 1 && i < 2*blockSize {
				v = int64(i)
			}
			prompts[p] = append(prompts[p], v)
		}
	}
	hasher, err := blockhash.New(blockhash.Options{HashBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	// The "default" row is also what a stock router finds: it hashes
	// prompts without a salt.
	spaces := []space{
		{name: "default", stores: []int{0}},
		{name: "acme", token: "acme-token-0123456789", salt: "kvtier_tenant:acme", stores: []int{0, 1}},
		{name: "beta", token: "beta-token-0123456789", salt: "beta's salt", stores: []int{0}},
		{name: "docs", token: "beta-token-0123456789", ns: "docs", salt: "kvtier_tenant:docs", stores: []int{1, 2}},
	}
	clients := map[string]*client.Client{}
	for _, s := range spaces {
		c, err := client.Dial(dir+"/k.sock", client.Options{Token: s.token, Namespace: s.ns})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[s.name] = c
	}
	put := func(s space, p int) {
		t.Helper()
		tokens := prompts[p]
		keys := hasher.Keys(tokens, 0)
		blocks := make([]client.Block, len(keys))
		for i, k := range keys {
			m := &kvtierv1.BlockMetadata{BlockHashes: [][]byte{[]byte(k.Hash())}, TokenIds: tokens[i*blockSize : (i+1)*blockSize], BlockSize: blockSize}
			if i > 0 {
				m.ParentBlockHash = []byte(keys[i-1].Hash())
			}
			blocks[i] = client.Block{Key: k, Data: make([]byte, 4096), Meta: m}
			blocks[i].Data[0] = byte(p + 1)
		}
		if _, err := clients[s.name].PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
			t.Fatalf("%s stores prompt %d: %v", s.name, p, err)
		}
	}
	// routerKeys are the keys a router computes for space s's prompt p:
	// the space's salt as the first block's extra key, as for a cache_salt.
	routerKeys := func(s space, p int) []kvblock.BlockHash {
		var extra []*kvblock.BlockExtraFeatures
		if s.salt != "" {
			extra = make([]*kvblock.BlockExtraFeatures, len(prompts[p])/blockSize)
			extra[0] = &kvblock.BlockExtraFeatures{MMHashes: []kvblock.MMHash{{Hash: s.salt}}}
		}
		toks := make([]uint32, len(prompts[p]))
		for i, v := range prompts[p] {
			toks[i] = uint32(v)
		}
		keys, err := tp.TokensToKVBlockKeys(kvblock.EmptyBlockHash, toks, model, extra)
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	// found is how many of the router's keys the index holds, and whether
	// they are the leading ones.
	found := func(s space, p int) (int, bool) {
		keys := routerKeys(s, p)
		got, err := index.Lookup(ctx, keys, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for n < len(keys) && len(got[keys[n]]) > 0 {
			n++
		}
		return len(got), n == len(got)
	}
	// want: the leading chunks of p that some prompt s stores begins with.
	want := func(s space, p int) int {
		best := 0
		for _, q := range s.stores {
			n := 0
			for n < 4 && prompts[p][(n+1)*blockSize-1] == prompts[q][(n+1)*blockSize-1] && prompts[p][n*blockSize] == prompts[q][n*blockSize] {
				n++
			}
			best = max(best, n)
		}
		return best
	}

	// The subscriber connects in the background: store a warm-up prompt
	// in the daemon's own space until the index has it.
	warm := space{name: "default"}
	prompts = append(prompts, make([]int64, blockSize))
	for i := range prompts[3] {
		prompts[3][i] = int64(90000 + i)
	}
	warmKeys := hasher.Keys(prompts[3], 0)
	eventually(t, "the subscriber receives the warm-up block", func() error {
		if _, err := clients["default"].Delete(ctx, warmKeys); err != nil {
			return err
		}
		put(warm, 3)
		time.Sleep(100 * time.Millisecond)
		if n, _ := found(warm, 3); n != 1 {
			return fmt.Errorf("not indexed")
		}
		return nil
	})
	if _, err := clients["default"].Delete(ctx, warmKeys); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm-up block leaves the index", func() error {
		if n, _ := found(warm, 3); n != 0 {
			return fmt.Errorf("still indexed")
		}
		return nil
	})

	for _, s := range spaces {
		for _, p := range s.stores {
			put(s, p)
		}
	}
	check := func(what string, expect func(s space, p int) int) {
		t.Helper()
		eventually(t, what, func() error {
			for _, s := range spaces {
				for p := 0; p < 3; p++ {
					n, leading := found(s, p)
					if w := expect(s, p); n != w || !leading {
						return fmt.Errorf("space %s, prompt %d: the router finds %d chunks (leading %v), want %d", s.name, p, n, leading, w)
					}
				}
			}
			return nil
		})
		for _, s := range spaces {
			for p := 0; p < 3; p++ {
				n, _ := found(s, p)
				t.Logf("%s: space %-7s prompt %d: %d of 4 chunks found", what, s.name, p, n)
			}
		}
	}
	check("after the stores", want)

	// Every space deletes its blocks from every tier.
	for _, s := range spaces {
		for _, p := range s.stores {
			if _, err := clients[s.name].Delete(ctx, hasher.Keys(prompts[p], 0)); err != nil {
				t.Fatalf("%s deletes prompt %d: %v", s.name, p, err)
			}
		}
	}
	check("after the deletes", func(space, int) int { return 0 })
	if n := errs.Load(); n != 0 {
		t.Fatalf("llm-d logged %d errors; the last: %v", n, last.Load())
	}
}
