package tierset

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

func TestDeclareRemote(t *testing.T) {
	decls, err := Declare(mustParse(t, `
secondary_tiers:
  - {name: objects, type: s3, bucket: kv-cache, endpoint: "http://10.0.0.5:7070", locality: Remote}
  - {name: dram, type: redis, addr: "10.0.0.7:6379", locality: remote}
  - {name: rack, type: REDIS, addr: "10.0.0.8:6379", locality: local}
  - {type: s3, bucket: dyn}
  - {type: redis, addr: "h:1"}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []explain.Declaration{
		{Name: "objects", Type: "s3", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
		{Name: "dram", Type: "redis", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
		{Name: "rack", Type: "redis", Medium: offload.MediumCPU, Locality: offload.LocalityLocal},
		{Name: "s33", Type: "s3", Medium: offload.MediumStorage, Locality: offload.LocalityUnspecified},
		{Name: "redis4", Type: "redis", Medium: offload.MediumCPU, Locality: offload.LocalityUnspecified},
	}
	if !slices.Equal(decls, want) {
		t.Errorf("Declare = %v\nwant      %v", decls, want)
	}
}

func TestRemoteErrors(t *testing.T) {
	for _, tc := range []struct{ tier, want string }{
		{"{type: s3}", `secondary_tiers[0].bucket: required`},
		{"{type: s3, bucket: Kv_Cache}", `secondary_tiers[0].bucket: "Kv_Cache": character 'K' not allowed`},
		{"{type: s3, bucket: b12, endpoint: 'ftp://x'}", `secondary_tiers[0].endpoint: "ftp://x" is not an http:// or https:// URL`},
		{"{type: s3, bucket: b12, locality: moon}", `secondary_tiers[0].locality: invalid value "moon" (want local or remote)`},
		{"{type: s3, bucket: b12, medium: cpu}", `secondary_tiers[0].medium: unknown key (want one of: name, type, bucket, prefix,`},
		{"{type: s3, bucket: b12, io_threads: -1}", `secondary_tiers[0].io_threads: must be > 0, got -1`},
		{"{type: s3, bucket: b12, timeout: soon}", `secondary_tiers[0].timeout: `},
		{"{type: s3, bucket: b12, access_key: a}", `secondary_tiers[0].secret_key: required when access_key is set`},
		{"{type: s3, bucket: b12, prefix: ../up}", `secondary_tiers[0].prefix: "../up" must be relative`},
		{"{type: s3, bucket: b12, namespace: {rank: -1}}", `secondary_tiers[0].namespace: rank must be >= 0, got -1`},
		{"{type: s3, bucket: b12, namespace: {tp: 2}}", `secondary_tiers[0].namespace.tp: unknown key`},
		{"{type: redis}", `secondary_tiers[0].addr: required (host:port)`},
		{"{type: redis, addr: nohost}", `secondary_tiers[0].addr: "nohost" is not host:port`},
		{"{type: redis, addr: 'h:1', locality: moon}", `secondary_tiers[0].locality: invalid value "moon" (want local or remote)`},
		{"{type: redis, addr: 'h:1', ttl: -1s}", `secondary_tiers[0].ttl: must be >= 0, got -1s`},
		{"{type: redis, addr: 'h:1', ttl: soon}", `secondary_tiers[0].ttl: `},
		{"{type: redis, addr: 'h:1', key_prefix: 'a b'}", `secondary_tiers[0].key_prefix: "a b" must not contain whitespace`},
		{"{type: redis, addr: 'h:1', pool_size: -2}", `secondary_tiers[0].pool_size: must be > 0, got -2`},
		{"{type: redis, addr: 'h:1', bucket: b}", `secondary_tiers[0].bucket: unknown key (want one of: name, type, addr,`},
	} {
		cfg := mustParse(t, "secondary_tiers: ["+tc.tier+"]\n")
		_, err := Declare(cfg)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Declare(%s) = %v, want %s...", tc.tier, err, tc.want)
			continue
		}
		// Build reports the same problem, before contacting anything.
		if _, berr := Build(context.Background(), cfg, Options{}); berr == nil || berr.Error() != err.Error() {
			t.Errorf("Build(%s) = %v, want the Declare error", tc.tier, berr)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the tiers' logging goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBuildRemoteFakes builds s3 and redis tiers from a config file
// against gofakes3 and miniredis, stores one block in each, and checks
// what the config's namespace and events switch did to them.
func TestBuildRemoteFakes(t *testing.T) {
	backend := s3mem.New()
	s3srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(s3srv.Close)
	mr := miniredis.RunT(t)

	for _, global := range []bool{false, true} {
		t.Run(fmt.Sprintf("events.enabled=%v", global), func(t *testing.T) {
			ctx := context.Background()
			bucket := fmt.Sprintf("ev-%v", global)
			cfg := mustParse(t, fmt.Sprintf(`
namespace: {model: org/m, bytes_per_block: 4KiB}
primary: {bytes: 1MiB}
events: {enabled: %v}
secondary_tiers:
  - {name: obj, type: s3, bucket: %s, prefix: pre, endpoint: %q, access_key: a, secret_key: b, create_bucket: true, locality: remote, events: true}
  - {name: own, type: s3, bucket: %s, prefix: own, endpoint: %q, access_key: a, secret_key: b, namespace: {model_name: other}}
  - {name: dram, type: redis, addr: %q, key_prefix: "t%v:", locality: remote, events: true}
`, global, bucket, s3srv.URL, bucket, s3srv.URL, mr.Addr(), global))
			var logs syncBuffer
			tiers, err := Build(ctx, cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(ctx, tiers)
			want := []explain.Declaration{
				{Name: "obj", Type: "s3", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
				{Name: "own", Type: "s3", Medium: offload.MediumStorage, Locality: offload.LocalityUnspecified},
				{Name: "dram", Type: "redis", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
			}
			for i, tier := range tiers {
				if got := explain.DeclarationOf(tier); got != want[i] {
					t.Errorf("tier %d declares %v, want %v", i, got, want[i])
				}
			}

			arena := rt.NewArena(4096, 1)
			arena.Fill(0, 7)
			key := rt.Key(1)
			for i, tier := range tiers {
				res := rt.Run(t, tier, &offload.Job{ID: uint64(i + 1), Keys: []offload.Key{key}, Slots: []int64{0}, Arena: arena})
				if !res.Success {
					t.Fatalf("store to %s: %v", tier.Name(), res.Err)
				}
			}

			// The daemon's namespace names the s3 layout unless the entry
			// sets its own, as for fs.
			objs, err := backend.ListBucket(bucket, nil, gofakes3.ListBucketPage{})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, o := range objs.Contents {
				names = append(names, o.Key)
			}
			slices.Sort(names)
			hex := key.HexHash()
			if len(names) != 2 || !strings.HasPrefix(names[0], "own/other_") || !strings.HasPrefix(names[1], "pre/org_m_") ||
				!strings.HasSuffix(names[0], hex+".bin") || !strings.HasSuffix(names[1], hex+".bin") {
				t.Errorf("objects %v, want one under pre/org_m_… and one under own/other_…, named %s.bin", names, hex)
			}
			if !mr.Exists(fmt.Sprintf("t%v:%s:0", global, hex)) {
				t.Errorf("redis key for %s missing; keys %v", key, mr.Keys())
			}

			// Events: when events are on globally, from every tier whose
			// entry does not turn them off ("own" says nothing: on); with
			// them off, one warning per tier that opted in.
			for i, tier := range tiers {
				evs := tier.TakeEvents()
				optedIn := i != 1
				if wantEvents := global; (len(evs) > 0) != wantEvents {
					t.Errorf("%s: events %v, want some: %v", tier.Name(), evs, wantEvents)
				}
				warn := fmt.Sprintf("events is set on secondary tier '%s' but KV cache events are disabled globally; the tier will not emit events.", tier.Name())
				if n, wantN := strings.Count(logs.String(), warn), map[bool]int{true: 1}[optedIn && !global]; n != wantN {
					t.Errorf("%s: warning logged %d times, want %d; logs:\n%s", tier.Name(), n, wantN, logs.String())
				}
			}
		})
	}
}

// TestBuildRemoteUnreachable: Build contacts the servers, so a missing
// bucket or a dead server fails it, naming the entry; tiers built before
// the failing one are closed.
func TestBuildRemoteUnreachable(t *testing.T) {
	backend := s3mem.New()
	s3srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(s3srv.Close)
	mr := miniredis.RunT(t)
	dead := miniredis.RunT(t)
	deadAddr := dead.Addr()
	dead.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct{ tiers, want string }{
		{fmt.Sprintf("[{name: ok, type: redis, addr: %q}, {name: nob, type: s3, bucket: missing, endpoint: %q, access_key: a, secret_key: b}]", mr.Addr(), s3srv.URL),
			"secondary_tiers[1] (nob): "},
		{fmt.Sprintf("[{name: gone, type: redis, addr: %q, dial_timeout: 200ms, timeout: 200ms}]", deadAddr),
			"secondary_tiers[0] (gone): "},
	} {
		_, err := Build(ctx, mustParse(t, "secondary_tiers: "+tc.tiers+"\n"), Options{Logger: slog.New(slog.DiscardHandler)})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Build(%s) = %v, want %s...", tc.tiers, err, tc.want)
		}
	}
}

// TestDeclareContactsNothing: Declare (what `kvtier explain` runs) checks
// s3 and redis entries without connecting to their servers.
func TestDeclareContactsNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			accepted <- struct{}{}
		}
	}()
	defer ln.Close()
	addr := ln.Addr().String()
	cfg := mustParse(t, fmt.Sprintf(`
secondary_tiers:
  - {type: s3, bucket: kv-cache, endpoint: "http://%s", create_bucket: true}
  - {type: redis, addr: %q, keyspace_events: true}
`, addr, addr))
	decls, err := Declare(cfg)
	if err != nil || len(decls) != 2 {
		t.Fatalf("Declare = %v, %v", decls, err)
	}
	select {
	case <-accepted:
		t.Fatal("Declare connected to the server")
	case <-time.After(50 * time.Millisecond):
	}
}

// TestRedisDefaultPrefixSeparatesNamespaces: two daemons serving different
// models (or block sizes) from one Redis, both with the default key
// prefix, never find each other's blocks; an explicit key_prefix is kept.
func TestRedisDefaultPrefixSeparatesNamespaces(t *testing.T) {
	mr := miniredis.RunT(t)
	ctx := context.Background()
	build := func(ns, extra string) offload.SecondaryTier {
		t.Helper()
		cfg := mustParse(t, fmt.Sprintf(`
namespace: %s
primary: {bytes: 1MiB}
secondary_tiers:
  - {name: dram, type: redis, addr: %q%s}
`, ns, mr.Addr(), extra))
		tiers, err := Build(ctx, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeAll(ctx, tiers) })
		return tiers[0]
	}
	writer := build("{model: org/a, bytes_per_block: 4KiB}", "")
	arena := rt.NewArena(4096, 1)
	arena.Fill(0, 3)
	key := rt.Key(42)
	if res := rt.Run(t, writer, &offload.Job{ID: 1, Keys: []offload.Key{key}, Slots: []int64{0}, Arena: arena}); !res.Success {
		t.Fatalf("store: %v", res.Err)
	}
	if got := mr.Keys(); len(got) != 1 || !strings.HasPrefix(got[0], "kvtier:org/a:4096:") {
		t.Fatalf("redis keys %v, want one under kvtier:org/a:4096:", got)
	}
	for _, c := range []struct{ name, ns, extra string }{
		{"other model", "{model: org/b, bytes_per_block: 4KiB}", ""},
		{"other block size", "{model: org/a, bytes_per_block: 8KiB}", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := rt.Resolve(t, build(c.ns, c.extra), key, offload.Background("r")); got != offload.Miss {
				t.Errorf("lookup from another namespace = %v, want MISS", got)
			}
		})
	}
	t.Run("same namespace", func(t *testing.T) {
		if got := rt.Resolve(t, build("{model: org/a, bytes_per_block: 4KiB}", ""), key, offload.Background("r")); got != offload.Hit {
			t.Errorf("lookup from the same namespace = %v, want HIT", got)
		}
	})
	t.Run("explicit prefix kept", func(t *testing.T) {
		tier := build("{model: org/a, bytes_per_block: 4KiB}", `, key_prefix: "mine:"`)
		if res := rt.Run(t, tier, &offload.Job{ID: 2, Keys: []offload.Key{key}, Slots: []int64{0}, Arena: arena}); !res.Success {
			t.Fatalf("store: %v", res.Err)
		}
		if !mr.Exists(fmt.Sprintf("mine:%s:0", key.HexHash())) {
			t.Errorf("explicit key_prefix not used; keys %v", mr.Keys())
		}
	})
}

// A tier's events follow the daemon's unless its entry says otherwise.
func TestEventsDefaultToTheDaemons(t *testing.T) {
	ctx := context.Background()
	for _, global := range []bool{false, true} {
		cfg := mustParse(t, fmt.Sprintf(`
namespace: {model: m, bytes_per_block: 4KiB}
primary: {bytes: 1MiB}
events: {enabled: %v, endpoint: "tcp://127.0.0.1:1"}
secondary_tiers:
  - {name: silent, type: memory, medium: storage, locality: local, events: false}
  - {name: default, type: memory, medium: storage, locality: local}
  - {name: disk, type: fs, root_dir: %q}
`, global, t.TempDir()))
		tiers, err := Build(ctx, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		arena := rt.NewArena(4096, 1)
		for i, tier := range tiers {
			if res := rt.Run(t, tier, &offload.Job{ID: uint64(i + 1), Keys: []offload.Key{rt.Key(1)}, Slots: []int64{0}, Arena: arena}); !res.Success {
				t.Fatalf("store to %s: %v", tier.Name(), res.Err)
			}
			want := global && tier.Name() != "silent"
			if evs := tier.TakeEvents(); (len(evs) > 0) != want {
				t.Errorf("events.enabled=%v: %s emitted %v, want events: %v", global, tier.Name(), evs, want)
			}
		}
		if err := closeAll(ctx, tiers); err != nil {
			t.Fatal(err)
		}
	}
}

// A peer tier has no events of its own (its peers publish theirs): a
// daemon with events on builds it, instead of failing on an "events" key
// the peer tier does not take.
func TestEventsOnWithAPeerTier(t *testing.T) {
	cfg := mustParse(t, `
namespace: {model: m, bytes_per_block: 4KiB}
primary: {bytes: 1MiB}
events: {enabled: true, endpoint: "tcp://127.0.0.1:1"}
secondary_tiers:
  - {name: fleet, type: peer, peers: [{name: a, addr: "127.0.0.1:1"}]}
`)
	tiers, err := Build(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := closeAll(context.Background(), tiers); err != nil {
		t.Fatal(err)
	}
}
