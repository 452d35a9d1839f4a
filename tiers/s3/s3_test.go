package s3

import (
	"bytes"
	"context"
	"errors"
	"io"
	iofs "io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/remote"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

const testBucket = "kvtier-test"

// fakeS3 is gofakes3 behind an HTTP server that can be stopped and
// restarted on the same address, with an optional gate that holds
// requests.
type fakeS3 struct {
	t       *testing.T
	backend *s3mem.Backend
	handler http.Handler
	addr    string
	srv     *httptest.Server

	mu   sync.Mutex
	gate chan struct{} // non-nil: requests wait until it is closed

	heads atomic.Int64 // HEAD object requests received (not HEAD bucket)
}

func startFake(t *testing.T) *fakeS3 {
	f := &fakeS3{t: t, backend: s3mem.New()}
	f.handler = gofakes3.New(f.backend).Server()
	if err := f.backend.CreateBucket(testBucket); err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.addr = f.srv.Listener.Addr().String()
	t.Cleanup(func() { f.stop() })
	return f
}

func (f *fakeS3) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead && strings.Count(strings.Trim(r.URL.Path, "/"), "/") > 0 {
		f.heads.Add(1)
	}
	f.mu.Lock()
	g := f.gate
	f.mu.Unlock()
	if g != nil {
		select {
		case <-g:
		case <-r.Context().Done():
			return
		}
	}
	f.handler.ServeHTTP(w, r)
}

func (f *fakeS3) hold() func() {
	g := make(chan struct{})
	f.mu.Lock()
	f.gate = g
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.gate = nil
			f.mu.Unlock()
			close(g)
		})
	}
}

func (f *fakeS3) endpoint() string { return "http://" + f.addr }

func (f *fakeS3) stop() {
	if f.srv != nil {
		f.srv.CloseClientConnections()
		f.srv.Close()
		f.srv = nil
	}
}

func (f *fakeS3) restart() {
	f.t.Helper()
	var l net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if l, err = net.Listen("tcp", f.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		f.t.Fatalf("relisten on %s: %v", f.addr, err)
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Listener.Close()
	f.srv.Listener = l
	f.srv.Start()
}

func testConfig(endpoint string) Config {
	cfg := DefaultConfig()
	cfg.Name = "objects"
	cfg.Bucket = testBucket
	cfg.Prefix = "pfx"
	cfg.Endpoint = endpoint
	cfg.AccessKey, cfg.SecretKey = "AK", "SK"
	cfg.Locality = "remote"
	cfg.IOThreads = 4
	cfg.Timeout = 2 * time.Second
	cfg.RetryBackoff = time.Millisecond
	cfg.ProbeInterval = 20 * time.Millisecond
	cfg.Events = true
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

func newTier(t *testing.T, cfg Config) *Tier {
	t.Helper()
	return rt.NewTier(t, New, cfg)
}

// rawClient talks to the same bucket without the tier, to inspect and
// corrupt objects.
func rawClient(cfg Config) *s3.Client {
	return newClient(cfg.withDefaults(), http.DefaultClient)
}

func TestConfigValidation(t *testing.T) {
	base := testConfig("http://127.0.0.1:1")
	cases := []rt.ConfigCase[Config]{
		{Name: "ok", Mod: func(*Config) {}},
		{Name: "no bucket", Mod: func(c *Config) { c.Bucket = "" }, Key: "bucket"},
		{Name: "bad bucket", Mod: func(c *Config) { c.Bucket = "Bad_Bucket" }, Key: "bucket"},
		{Name: "bad endpoint", Mod: func(c *Config) { c.Endpoint = "ftp://x" }, Key: "endpoint"},
		{Name: "endpoint without host", Mod: func(c *Config) { c.Endpoint = "http://" }, Key: "endpoint"},
		{Name: "bad locality", Mod: func(c *Config) { c.Locality = "nearby" }, Key: "locality"},
		{Name: "global is no tier's locality", Mod: func(c *Config) { c.Locality = "GLOBAL" }, Key: "locality"},
		{Name: "access without secret", Mod: func(c *Config) { c.SecretKey = "" }, Key: "secret_key"},
		{Name: "secret without access", Mod: func(c *Config) { c.AccessKey = "" }, Key: "access_key"},
		{Name: "negative io_threads", Mod: func(c *Config) { c.IOThreads = -1 }, Key: "io_threads"},
		{Name: "negative max_inflight", Mod: func(c *Config) { c.MaxInflight = -2 }, Key: "max_inflight"},
		{Name: "negative retries", Mod: func(c *Config) { c.Retries = -1 }, Key: "retries"},
		{Name: "negative timeout", Mod: func(c *Config) { c.Timeout = -time.Second }, Key: "timeout"},
		{Name: "negative backoff", Mod: func(c *Config) { c.RetryBackoff = -1 }, Key: "retry_backoff"},
		{Name: "prefix traversal", Mod: func(c *Config) { c.Prefix = "../x" }, Key: "prefix"},
		{Name: "absolute prefix", Mod: func(c *Config) { c.Prefix = "/x" }, Key: "prefix"},
		{Name: "layout base with slash", Mod: func(c *Config) { c.Layout.Base = "a/b" }, Key: "layout"},
	}
	rt.CheckConfig(t, base, func(c Config) error { return c.withDefaults().Validate() }, cases)
}

func TestConfigCredentialsFromEnv(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "envAK")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envSK")
	t.Setenv("AWS_REGION", "")
	c := Config{Bucket: testBucket}.withDefaults()
	if c.AccessKey != "envAK" || c.SecretKey != "envSK" || c.Region != DefaultRegion {
		t.Fatalf("got %q %q %q", c.AccessKey, c.SecretKey, c.Region)
	}
	c = Config{Bucket: testBucket, AccessKey: "a", SecretKey: "s"}.withDefaults()
	if c.AccessKey != "a" {
		t.Fatalf("config credentials overridden by env: %q", c.AccessKey)
	}
}

func TestLayoutPath(t *testing.T) {
	k := offload.MakeKey([]byte{0xab, 0xcd, 0xef, 0x01, 0x23}, 7)
	got := objectKey("pfx", Layout{Base: "meta-llama_Llama-3_0123456789ab", Rank: 2}, k)
	want := "pfx/meta-llama_Llama-3_0123456789ab_r2/abc/de_g7/abcdef0123.bin"
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	if got := objectKey("", Layout{}, offload.MakeKey([]byte{0x01}, 0)); got != "kvtier_r0/01/_g0/01.bin" {
		t.Fatalf("short hash: %s", got)
	}
}

func TestStartupErrors(t *testing.T) {
	f := startFake(t)
	t.Run("missing bucket", func(t *testing.T) {
		cfg := testConfig(f.endpoint())
		cfg.Bucket = "no-such-bucket"
		_, err := New(context.Background(), cfg)
		if !errors.Is(err, ErrBucketNotFound) || !strings.Contains(err.Error(), "create_bucket") {
			t.Fatalf("got %v, want ErrBucketNotFound mentioning create_bucket", err)
		}
	})
	t.Run("create bucket", func(t *testing.T) {
		cfg := testConfig(f.endpoint())
		cfg.Bucket = "created-bucket"
		cfg.CreateBucket = true
		tier := newTier(t, cfg)
		if _, err := rawClient(cfg).HeadBucket(context.Background(), &s3.HeadBucketInput{Bucket: aws.String("created-bucket")}); err != nil {
			t.Fatalf("bucket not created: %v", err)
		}
		_ = tier
	})
	t.Run("unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		_, err = New(context.Background(), testConfig("http://"+addr))
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), addr) {
			t.Fatalf("got %v, want ErrUnreachable naming %s", err, addr)
		}
	})
	t.Run("invalid config", func(t *testing.T) {
		cfg := testConfig(f.endpoint())
		cfg.IOThreads = -3
		if _, err := New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "io_threads") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestDeclarations(t *testing.T) {
	f := startFake(t)
	tier := newTier(t, testConfig(f.endpoint()))
	if tier.Type() != "s3" || tier.Name() != "objects" || tier.Medium() != offload.MediumStorage || tier.Locality() != offload.LocalityRemote {
		t.Fatalf("got %s %s %v %v", tier.Type(), tier.Name(), tier.Medium(), tier.Locality())
	}
	if !tier.Healthy() {
		t.Fatal("new tier unhealthy")
	}
	if p := tier.OnNewRequest(offload.Background("x")); p != offload.BlockLevel {
		t.Fatalf("policy %v", p)
	}
}

func TestStoreLookupLoadRoundTrip(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	tier := newTier(t, cfg)
	const slot = 64<<10 + 3 // odd size: no alignment assumptions
	src := rt.NewArena(slot, 4)
	for i := 0; i < 4; i++ {
		src.Fill(int64(i), uint64(i+1))
	}
	keys := rt.Keys(0, 3)
	req, _ := offload.NewReqContext("req-1", nil)

	// Unknown keys: Retry first, Miss once the batch ran.
	if r := tier.Lookup(keys[0], req); r != offload.Retry {
		t.Fatalf("first lookup %v, want RETRY", r)
	}
	if r := rt.Resolve(t, tier, keys[0], req); r != offload.Miss {
		t.Fatalf("lookup before store %v, want MISS", r)
	}

	res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, 3)))
	if !res.Success || res.Err != nil || res.Bytes != 3*slot {
		t.Fatalf("store: %+v", res)
	}
	evs := tier.TakeEvents()
	if len(evs) != 1 || evs[0].Removed || evs[0].Medium != offload.MediumStorage || evs[0].Locality != offload.LocalityRemote || evs[0].Tier != "objects" || len(evs[0].Keys) != 3 || evs[0].Keys[2] != keys[2] {
		t.Fatalf("events %+v", evs)
	}

	// The objects follow the layout under the prefix.
	okey := objectKey("pfx", Layout{}, keys[1])
	if _, err := rawClient(cfg).HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String(testBucket), Key: aws.String(okey)}); err != nil {
		t.Fatalf("object %s: %v", okey, err)
	}

	req2, _ := offload.NewReqContext("req-2", nil)
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req2); r != offload.Hit {
			t.Fatalf("lookup %s after store: %v", k, r)
		}
	}
	if r := rt.Resolve(t, tier, rt.Key(99), req2); r != offload.Miss {
		t.Fatalf("lookup of absent key %v", r)
	}

	dst := rt.NewArena(slot, 4)
	res = rt.Run(t, tier, rt.LoadJob(2, dst, keys, []int64{3, 2, 1}, req2))
	if !res.Success || res.Bytes != 3*slot {
		t.Fatalf("load: %+v", res)
	}
	for i, d := range []int64{3, 2, 1} {
		want, _ := src.Slot(int64(i))
		got, _ := dst.Slot(d)
		if !bytes.Equal(got, want) {
			t.Fatalf("slot %d differs after round trip", d)
		}
	}
	if evs := tier.TakeEvents(); len(evs) != 0 {
		t.Fatalf("load emitted events %+v", evs)
	}

	// A second store of the same keys skips the uploads.
	res = rt.Run(t, tier, rt.StoreJob(3, src, keys, rt.Slots(0, 3)))
	if !res.Success {
		t.Fatalf("re-store %+v", res)
	}
	st := tier.Stats()
	if st.BlocksStored != 3 || st.BlocksExisted != 3 || st.BlocksLoaded != 3 || st.StoreJobsOK != 2 || st.LoadJobsOK != 1 || st.BytesRead != 3*slot || !st.Healthy {
		t.Fatalf("stats %+v", st)
	}
	tier.OnRequestFinished(req)
	tier.OnRequestFinished(req2)
	rt.Drain(t, tier)
	if tier.HasPendingWork() {
		t.Fatal("pending work after drain and results taken")
	}
}

func TestCorruptObjectIsMissDeletedCounted(t *testing.T) {
	const slot = 4096
	cases := []struct {
		name    string
		corrupt func(good []byte, other []byte) []byte
	}{
		{"flipped payload bit", func(g, _ []byte) []byte { b := bytes.Clone(g); b[remote.HeaderSize+100] ^= 1; return b }},
		{"truncated payload", func(g, _ []byte) []byte { return g[:len(g)-10] }},
		{"truncated header", func(g, _ []byte) []byte { return g[:10] }},
		{"empty object", func(g, _ []byte) []byte { return nil }},
		{"trailing bytes", func(g, _ []byte) []byte { return append(bytes.Clone(g), 1, 2, 3) }},
		{"bad magic", func(g, _ []byte) []byte { b := bytes.Clone(g); b[0] = 'X'; return b }},
		{"another key's block", func(_, o []byte) []byte { return o }},
		{"foreign bytes", func(g, _ []byte) []byte { return bytes.Repeat([]byte{7}, len(g)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t)
			cfg := testConfig(f.endpoint())
			tier := newTier(t, cfg)
			raw := rawClient(cfg)
			src := rt.NewArena(slot, 2)
			src.Fill(0, 1)
			src.Fill(1, 2)
			keys := rt.Keys(0, 2)
			if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, 2))); !res.Success {
				t.Fatalf("store %+v", res)
			}
			tier.TakeEvents()
			ctx := context.Background()
			get := func(k offload.Key) []byte {
				out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(testBucket), Key: aws.String(objectKey("pfx", Layout{}, k))})
				if err != nil {
					t.Fatal(err)
				}
				defer out.Body.Close()
				b, _ := io.ReadAll(out.Body)
				return b
			}
			bad := tc.corrupt(get(keys[0]), get(keys[1]))
			okey := objectKey("pfx", Layout{}, keys[0])
			if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(testBucket), Key: aws.String(okey), Body: bytes.NewReader(bad)}); err != nil {
				t.Fatal(err)
			}

			req, _ := offload.NewReqContext("r", nil)
			if r := rt.Resolve(t, tier, keys[0], req); r != offload.Hit {
				t.Fatalf("lookup of the corrupted key: %v (existence only)", r)
			}
			dst := rt.NewArena(slot, 2)
			res := rt.Run(t, tier, rt.LoadJob(2, dst, keys, rt.Slots(0, 2), req))
			// The corrupt block fails alone (issue 11): the other loads.
			if res.Success || !errors.Is(res.Err, remote.ErrCorrupt) || len(res.SuccessfulKeys) != 1 || res.SuccessfulKeys[0] != keys[1] {
				t.Fatalf("load of corrupted block: %+v", res)
			}
			// The same request now answers Miss without probing again.
			if r := tier.Lookup(keys[0], req); r != offload.Miss {
				t.Fatalf("lookup after failed load %v, want MISS", r)
			}
			if _, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(testBucket), Key: aws.String(okey)}); httpStatus(err) != http.StatusNotFound {
				t.Fatalf("corrupted object not deleted: %v", err)
			}
			st := tier.Stats()
			if st.Corrupted != 1 || st.Deleted != 1 || st.LoadJobsFailed != 1 {
				t.Fatalf("stats %+v", st)
			}
			evs := tier.TakeEvents()
			if len(evs) != 1 || !evs[0].Removed || len(evs[0].Keys) != 1 || evs[0].Keys[0] != keys[0] {
				t.Fatalf("events %+v", evs)
			}
			// Another request probes afresh and sees the block gone.
			req2, _ := offload.NewReqContext("r2", nil)
			if r := rt.Resolve(t, tier, keys[0], req2); r != offload.Miss {
				t.Fatalf("lookup by another request %v", r)
			}
		})
	}
}

func TestLoadPartialPrefixAndSizeMismatch(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	tier := newTier(t, cfg)
	src := rt.NewArena(1024, 3)
	for i := 0; i < 3; i++ {
		src.Fill(int64(i), uint64(i))
	}
	keys := rt.Keys(10, 3)
	// Store keys 0 and 2 only: key 1 is missing.
	if res := rt.Run(t, tier, rt.StoreJob(1, src, []offload.Key{keys[0], keys[2]}, []int64{0, 2})); !res.Success {
		t.Fatal(res)
	}
	req, _ := offload.NewReqContext("r", nil)
	tier.Lookup(keys[1], req) // the request references the key, as before a promotion
	dst := rt.NewArena(1024, 3)
	res := rt.Run(t, tier, rt.LoadJob(2, dst, keys, rt.Slots(0, 3), req))
	if res.Success || !slices.Equal(res.SuccessfulKeys, []offload.Key{keys[0], keys[2]}) || !errors.Is(res.Err, ErrNotFound) || res.Bytes != 2048 {
		t.Fatalf("partial load %+v", res)
	}
	if r := tier.Lookup(keys[1], req); r != offload.Miss {
		t.Fatalf("failed key lookup %v", r)
	}

	// An intact block of another slot size is a miss but is kept.
	small := rt.NewArena(512, 1)
	res = rt.Run(t, tier, rt.LoadJob(3, small, keys[:1], []int64{0}, req))
	if res.Success || !errors.Is(res.Err, remote.ErrSizeMismatch) {
		t.Fatalf("size mismatch load %+v", res)
	}
	st := tier.Stats()
	if st.SizeMismatch != 1 || st.Corrupted != 0 || st.Deleted != 0 {
		t.Fatalf("stats %+v", st)
	}
	if ok, err := tier.head(context.Background(), tier.retry, keys[0], 0); !ok || err != nil {
		t.Fatalf("mismatched block deleted: %v %v", ok, err)
	}
}

func TestBadJobsAnswered(t *testing.T) {
	f := startFake(t)
	tier := newTier(t, testConfig(f.endpoint()))
	arena := rt.NewArena(256, 2)
	jobs := []*offload.Job{
		rt.StoreJob(1, arena, rt.Keys(0, 1), []int64{5}),                              // slot out of range
		rt.StoreJob(2, arena, rt.Keys(0, 2), []int64{0}),                              // fewer slots than keys
		rt.StoreJob(3, arena, []offload.Key{"ab"}, []int64{0}),                        // invalid key
		rt.LoadJob(4, arena, rt.Keys(0, 1), []int64{-1}, offload.Background("r")),     // bad slot
		rt.LoadJob(5, arena, []offload.Key{"x"}, []int64{0}, offload.Background("r")), // invalid key
		{ID: 6, Arena: arena, Req: offload.Background("r")},                           // empty store job
		{ID: 7, Arena: arena, Promotion: true, Req: offload.Background("r")},          // empty load job
	}
	for _, j := range jobs {
		if j.Promotion {
			tier.SubmitLoad(j)
		} else {
			tier.SubmitStore(j)
		}
	}
	got := map[uint64]offload.JobResult{}
	for _, r := range rt.WaitJobs(t, tier, len(jobs), 10*time.Second) {
		got[r.JobID] = r
	}
	for id := uint64(1); id <= 5; id++ {
		if got[id].Success || got[id].Err == nil {
			t.Errorf("job %d: %+v, want failure", id, got[id])
		}
	}
	if !got[6].Success || !got[7].Success {
		t.Errorf("empty jobs: %+v %+v", got[6], got[7])
	}
}

func TestServerDownMissFastAndRecovers(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	cfg.Retries = 1
	tier := newTier(t, cfg)
	rt.RunServerDown(t, rt.ServerDown{Tier: tier, Stats: tier.Stats, Stop: f.stop, Restart: f.restart})
}

func TestCloseAnswersEveryJob(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	cfg.MaxInflight = 3
	tier, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	release := f.hold()
	defer release()
	arena := rt.NewArena(512, 8)
	req := offload.Background("r")
	for i := 0; i < 3; i++ {
		tier.SubmitStore(rt.StoreJob(uint64(i), arena, rt.Keys(i, 1), []int64{int64(i)}))
	}
	// The table is full: the fourth job fails at once.
	tier.SubmitLoad(rt.LoadJob(3, arena, rt.Keys(3, 1), []int64{3}, req))
	over := rt.WaitJobs(t, tier, 1, 10*time.Second)
	if over[0].JobID != 3 || !errors.Is(over[0].Err, remote.ErrOverloaded) {
		t.Fatalf("overloaded job %+v", over[0])
	}
	if !tier.HasPendingWork() {
		t.Fatal("no pending work with jobs held")
	}
	dctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := tier.DrainJobs(dctx); err == nil {
		t.Fatal("DrainJobs returned with jobs held")
	}
	cancel()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tier.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	res := rt.WaitJobs(t, tier, 3, 10*time.Second)
	for _, r := range res {
		if r.Success {
			t.Fatalf("held job succeeded after Close: %+v", r)
		}
	}
	tier.SubmitStore(rt.StoreJob(9, arena, rt.Keys(9, 1), []int64{0}))
	if r := rt.WaitJobs(t, tier, 1, 10*time.Second); !errors.Is(r[0].Err, remote.ErrClosed) {
		t.Fatalf("job after close %+v", r[0])
	}
	if r := tier.Lookup(rt.Key(1), req); r != offload.Miss {
		t.Fatalf("lookup after close %v", r)
	}
	if err := tier.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestEventsOff(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	cfg.Events = false
	tier := newTier(t, cfg)
	arena := rt.NewArena(128, 1)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, rt.Keys(0, 1), []int64{0})); !res.Success {
		t.Fatal(res)
	}
	if evs := tier.TakeEvents(); evs != nil {
		t.Fatalf("events with events off: %+v", evs)
	}
}

// TestLayoutMatchesFSTier checks that object keys are the paths an FS
// tier with the same namespace writes, relative to its root.
func TestLayoutMatchesFSTier(t *testing.T) {
	ns := filemapper.Namespace{ModelName: "org/model-7b", TokensPerHash: 16, DType: "bfloat16", Rank: 1,
		KVCacheGroups: []filemapper.KVCacheGroup{{TokensPerBlock: 16, LayerNames: []string{"l0", "l1"}}}}
	root := t.TempDir()
	ft, err := fs.New(fs.Config{Name: "fs", RootDir: root, Namespace: ns, ODirect: "off", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer ft.Close(context.Background())
	arena := rt.NewArena(4096, 1)
	k := offload.MakeKey([]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}, 2)
	if res := rt.Run(t, ft, rt.StoreJob(1, arena, []offload.Key{k}, []int64{0})); !res.Success {
		t.Fatalf("fs store %+v", res)
	}
	var files []string
	filepath.WalkDir(root, func(p string, d iofs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".bin") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	l, err := LayoutOf(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0] != l.Path(k) {
		t.Fatalf("fs wrote %v, s3 layout says %s", files, l.Path(k))
	}
	cfg := Config{Bucket: testBucket, Namespace: ns}
	if got, _ := cfg.layoutOf(); got != l {
		t.Fatalf("config layout %+v, want %+v", got, l)
	}
	if _, err := LayoutOf(filemapper.Namespace{}); err == nil {
		t.Fatal("empty namespace accepted")
	}
}

func TestThroughManager(t *testing.T) {
	f := startFake(t)
	rt.RunManager(t, rt.ManagerCase{
		Tier:        newTier(t, testConfig(f.endpoint())),
		ExcludeLoad: `{"kv_load_tiers": [{"medium": "cpu"}]}`,
	})
}

// A router's delete removes the objects (tiering.Deleter).
func TestDeleteThroughManager(t *testing.T) {
	f := startFake(t)
	rt.RunManagerDelete(t, rt.ManagerCase{Tier: newTier(t, testConfig(f.endpoint()))})
}

func TestThroughManagerOutage(t *testing.T) {
	f := startFake(t)
	tier := newTier(t, testConfig(f.endpoint()))
	rt.RunManagerOutage(t, rt.ManagerCase{Tier: tier}, rt.Outage{Stop: f.stop, Start: f.restart, Healthy: tier.Healthy})
}

// A server that accepts connections but never answers: lookups stop
// answering Retry after the lookup timeout, and the tier goes down.
func TestHungServerLookupsTimeOut(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	cfg.LookupTimeout = 100 * time.Millisecond
	cfg.UnhealthyAfter = 2
	tier := newTier(t, cfg)
	release := f.hold()
	defer release()
	req, _ := offload.NewReqContext("r", nil)
	keys := rt.Keys(0, 4)
	for _, k := range keys {
		if r := tier.Lookup(k, req); r != offload.Retry {
			t.Fatalf("first lookup %v", r)
		}
	}
	tier.OnScheduleEnd(offload.ScheduleEnd{})
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req); r != offload.Miss {
			t.Fatalf("lookup against a hung server %v", r)
		}
	}
	st := tier.Stats()
	if st.Timeouts == 0 || st.Healthy {
		t.Fatalf("stats %+v", st)
	}
	release()
	rt.Eventually(t, 5*time.Second, "recovery", tier.Healthy)
}

// TestHungServerStopsCheckingOnceDown: a step's existence checks against
// a server that accepts but never answers stop being sent as soon as the
// failures mark it down, rather than each waiting out its timeout.
func TestHungServerStopsCheckingOnceDown(t *testing.T) {
	f := startFake(t)
	cfg := testConfig(f.endpoint())
	cfg.IOThreads = 2
	cfg.UnhealthyAfter = 2
	cfg.LookupTimeout = 100 * time.Millisecond // the step's batch: 400ms
	tier := newTier(t, cfg)
	release := f.hold()
	defer release()
	req, _ := offload.NewReqContext("r", nil)
	keys := rt.Keys(0, 16)
	for _, k := range keys {
		tier.Lookup(k, req)
	}
	tier.OnScheduleEnd(offload.ScheduleEnd{})
	rt.Eventually(t, 5*time.Second, "tier down", func() bool { return !tier.Healthy() })
	rt.Eventually(t, 5*time.Second, "batch answered", func() bool { return !tier.HasPendingWork() })
	// Two HEADs (io_threads) mark it down; one more may start between the
	// two failures. Eight would be the batch's 400ms in 100ms waves of two.
	if n := f.heads.Load(); n > int64(cfg.IOThreads)+1 {
		t.Fatalf("%d HEADs sent to a hung server; want at most %d", n, cfg.IOThreads+1)
	}
	for _, k := range keys {
		if r := tier.Lookup(k, req); r != offload.Miss {
			t.Fatalf("lookup while down %v", r)
		}
	}
}

// recordingTransport records the host and path of every request.
type recordingTransport struct {
	mu   sync.Mutex
	urls []string
}

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.urls = append(r.urls, req.URL.Host+req.URL.Path)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// TestPathStyleAddressing: requests name the bucket in the path, never in
// the host name, even for an endpoint whose host is a name (with an IP
// address the SDK would use path-style anyway).
func TestPathStyleAddressing(t *testing.T) {
	f := startFake(t)
	_, port, _ := net.SplitHostPort(f.addr)
	rec := &recordingTransport{}
	cfg := testConfig("http://localhost:" + port)
	cfg.HTTPClient = &http.Client{Transport: rec}
	tier := newTier(t, cfg)
	arena := rt.NewArena(256, 1)
	keys := rt.Keys(0, 1)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, []int64{0})); !res.Success {
		t.Fatalf("store %+v", res)
	}
	if res := rt.Run(t, tier, rt.LoadJob(2, arena, keys, []int64{0}, offload.Background("r"))); !res.Success {
		t.Fatalf("load %+v", res)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := "localhost:" + port + "/" + testBucket
	if len(rec.urls) < 4 { // HEAD bucket, HEAD + PUT object, GET object
		t.Fatalf("requests %v", rec.urls)
	}
	for _, u := range rec.urls {
		if !strings.HasPrefix(u, want) {
			t.Fatalf("request to %s, want path-style %s/...", u, want)
		}
	}
}
