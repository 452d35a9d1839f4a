package tierset_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
	"github.com/kvtier/kvtier/tierset"
)

// The filter examples of the design discussion, end to end: a config
// file with the CPU primary (CPU/LOCAL, never filtered) and three real
// secondary tiers, built by tierset.Build and driven by tiering.Manager.
// The s3 tier talks to a real versitygw and the redis tier to a real
// redis-server (scripts/test.sh starts both); without them the test
// skips, unless KVTIER_REQUIRE_INTEGRATION=1.

// Tier names in config order (lookup priority).
const (
	fsName    = "local-ssd"   // fs, STORAGE/LOCAL
	s3Name    = "objects"     // s3, STORAGE/REMOTE
	redisName = "remote-dram" // redis, CPU/REMOTE
)

var tierNames = []string{fsName, s3Name, redisName}

const blockBytes = 4 << 10

// filterExamples: each request's kv_transfer_params, and the tiers it
// loads from (promotes out of) and stores to (cascades into).
var filterExamples = []struct {
	name        string
	params      string
	load, store []string
}{
	{"primary only (loads)", `{"kv_load_tiers":[]}`, nil, tierNames},
	{"primary only", `{"kv_load_tiers":[],"kv_store_tiers":[]}`, nil, nil},
	{"CPU tiers everywhere", `{"kv_load_tiers":[{"medium":"cpu"}]}`, []string{redisName}, tierNames},
	{"everything local", `{"kv_load_tiers":[{"locality":"local"}]}`, []string{fsName}, tierNames},
	{"remote CPU + local storage", `{"kv_load_tiers":[{"medium":"cpu","locality":"remote"},{"medium":"storage","locality":"local"}]}`,
		[]string{fsName, redisName}, tierNames},
	{"store to storage only", `{"kv_store_tiers":[{"medium":"storage"}]}`, tierNames, []string{fsName, s3Name}},
	{"default", `{}`, tierNames, tierNames},
}

// onlyIn is a store filter that selects exactly one of the tiers.
var onlyIn = map[string]string{
	fsName:    `{"kv_store_tiers":[{"medium":"storage","locality":"local"}]}`,
	s3Name:    `{"kv_store_tiers":[{"medium":"storage","locality":"remote"}]}`,
	redisName: `{"kv_store_tiers":[{"medium":"cpu"}]}`,
}

func TestIntegrationFilterExamplesCascade(t *testing.T) {
	w := newWorld(t)
	for _, ex := range filterExamples {
		t.Run(ex.name, func(t *testing.T) {
			w.t = t
			keys := w.freshKeys(2)
			before := w.snapshot()
			w.store(ex.params, keys)
			after := w.snapshot()
			for i, name := range tierNames {
				want := slices.Contains(ex.store, name)
				d := delta(before, after, i)
				if want && (d.CascadesOK != 1 || d.CascadedBlocks != uint64(len(keys)) || d.CascadesSkippedByFilter != 0) ||
					!want && (d.CascadesOK != 0 || d.CascadesSkippedByFilter != 1) || d.CascadesFailed+d.CascadesDropped != 0 {
					t.Errorf("%s: cascade stats delta %+v, want a cascade: %v", name, d, want)
				}
				if n := after.stores[i] - before.stores[i]; n != map[bool]int{true: 1}[want] {
					t.Errorf("%s: SubmitStore called %d times, want a cascade: %v", name, n, want)
				}
			}
			// The blocks really are in the stores, and only there.
			for _, k := range keys {
				if got := w.holders(k); !slices.Equal(got, sorted(ex.store)) {
					t.Errorf("block %s is in %v, want %v", k, got, ex.store)
				}
			}
		})
	}
}

func TestIntegrationFilterExamplesPromotion(t *testing.T) {
	w := newWorld(t)
	// One block in each tier only, placed with a store filter that
	// selects that tier; then the primary is emptied.
	placed := map[string]offload.Key{}
	for _, name := range tierNames {
		k := w.freshKeys(1)[0]
		w.store(onlyIn[name], []offload.Key{k})
		if got := w.holders(k); !slices.Equal(got, []string{name}) {
			t.Fatalf("block placed in %s is in %v", name, got)
		}
		placed[name] = k
	}
	w.reset()

	for _, ex := range filterExamples {
		t.Run(ex.name, func(t *testing.T) {
			w.t = t
			for _, holder := range tierNames {
				k := placed[holder]
				want := offload.Miss
				if slices.Contains(ex.load, holder) {
					want = offload.Hit
				}
				before := w.snapshot()
				got, id := w.lookup(ex.params, k)
				after := w.snapshot()
				if got != want {
					t.Errorf("block in %s: lookup = %v, want %v", holder, got, want)
				}
				for i, name := range tierNames {
					d := delta(before, after, i)
					asked := d.Hits + d.Misses + d.Retries
					switch {
					case !slices.Contains(ex.load, name):
						// Filtered out: never called for this request.
						if asked != 0 || d.SkippedByFilter == 0 || w.spies[i].lookups[id] != 0 || w.spies[i].loads[id] != 0 {
							t.Errorf("%s filtered out but consulted: stats delta %+v, lookups %d, loads %d",
								name, d, w.spies[i].lookups[id], w.spies[i].loads[id])
						}
					case name == holder:
						if d.Hits != 1 || d.PromotionsOK != 1 || d.PromotedBlocks != 1 || w.spies[i].loads[id] != 1 {
							t.Errorf("%s holds the block: stats delta %+v, loads %d; want one hit and one promotion",
								name, d, w.spies[i].loads[id])
						}
					default:
						if d.Hits != 0 || d.PromotionsStarted != 0 || w.spies[i].loads[id] != 0 {
							t.Errorf("%s does not hold the block but served it: stats delta %+v", name, d)
						}
					}
				}
				w.reset()
			}
		})
	}
}

// world is the four-tier stack and direct handles on the stores behind it.
type world struct {
	t     *testing.T
	ctx   context.Context
	cfg   *config.Config
	p     *cpu.Primary
	m     *tiering.Manager
	spies []*spy

	fsRoot string
	bucket string
	s3     *awss3.Client
	prefix string // redis key prefix
	rdb    *goredis.Client

	data map[offload.Key][]byte // stored bytes
	keyN int
	reqN int
}

// requireIntegration skips, or fails under KVTIER_REQUIRE_INTEGRATION=1.
func requireIntegration(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("KVTIER_REQUIRE_INTEGRATION") == "1" {
		t.Fatalf("KVTIER_REQUIRE_INTEGRATION=1 but %s is not set", what)
	}
	t.Skipf("%s not set; run scripts/test.sh (it starts versitygw and redis-server) to run this integration test", what)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ep, ak, sk := os.Getenv("KVTIER_TEST_S3_ENDPOINT"), os.Getenv("KVTIER_TEST_S3_ACCESS_KEY"), os.Getenv("KVTIER_TEST_S3_SECRET_KEY")
	raddr := os.Getenv("KVTIER_TEST_REDIS_ADDR")
	if ep == "" || ak == "" || sk == "" {
		requireIntegration(t, "KVTIER_TEST_S3_ENDPOINT/ACCESS_KEY/SECRET_KEY")
	}
	if raddr == "" {
		requireIntegration(t, "KVTIER_TEST_REDIS_ADDR")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &world{
		t:      t,
		ctx:    ctx,
		fsRoot: t.TempDir(),
		bucket: "kvtier-tierset-" + randomHex(6),
		prefix: "kvtier-tierset-" + randomHex(6) + ":",
		data:   map[offload.Key][]byte{},
	}
	w.s3 = awss3.New(awss3.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(ak, sk, ""),
		UsePathStyle: true,
		BaseEndpoint: aws.String(ep),
	})
	w.rdb = goredis.NewClient(&goredis.Options{Addr: raddr})
	t.Cleanup(w.cleanupStores) // registered first, so it runs after the manager closed

	var err error
	w.cfg, err = config.Parse(fmt.Appendf(nil, `
namespace: {model: it/model, bytes_per_block: %d}
primary: {bytes: %d}
secondary_tiers:
  - name: %s
    type: fs
    root_dir: %q
    locality: local
  - name: %s
    type: s3
    bucket: %s
    prefix: it
    endpoint: %q
    access_key: %q
    secret_key: %q
    create_bucket: true
    locality: remote
    retry_backoff: 5ms
  - name: %s
    type: redis
    addr: %q
    key_prefix: %q
    locality: remote
`, blockBytes, 64*blockBytes, fsName, w.fsRoot, s3Name, w.bucket, ep, ak, sk, redisName, raddr, w.prefix))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.Default()
	}
	tiers, err := tierset.Build(ctx, w.cfg, tierset.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	secondaries := make([]offload.SecondaryTier, len(tiers))
	for i, tier := range tiers {
		if tier.Name() != tierNames[i] {
			t.Fatalf("tier %d is %s, want %s", i, tier.Name(), tierNames[i])
		}
		s := &spy{SecondaryTier: tier, lookups: map[string]int{}, loads: map[string]int{}}
		w.spies = append(w.spies, s)
		secondaries[i] = s
	}
	slot, _ := w.cfg.Namespace.BytesPerBlock.Int()
	w.p, err = cpu.New(cpu.Config{SlotSize: slot, Capacity: int64(w.cfg.Primary.Bytes)})
	if err != nil {
		t.Fatal(err)
	}
	// Back-pressure off: this test is about filters, and a slow first
	// request to a fresh server must not drop a cascade.
	w.m, err = tiering.New(tiering.Config{Primary: w.p, Tiers: secondaries, Logger: log, Admission: tiering.AdmissionConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.m.Close(ctx); err != nil {
			t.Errorf("close manager: %v", err)
		}
	})
	return w
}

// cleanupStores removes the test's bucket and redis keys (best effort),
// so that a shared server does not accumulate them.
func (w *world) cleanupStores() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := awss3.NewListObjectsV2Paginator(w.s3, &awss3.ListObjectsV2Input{Bucket: aws.String(w.bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			break
		}
		for _, o := range page.Contents {
			w.s3.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(w.bucket), Key: o.Key})
		}
	}
	w.s3.DeleteBucket(ctx, &awss3.DeleteBucketInput{Bucket: aws.String(w.bucket)})
	iter := w.rdb.Scan(ctx, 0, w.prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		w.rdb.Del(ctx, iter.Val())
	}
	w.rdb.Close()
}

func (w *world) freshKeys(n int) []offload.Key {
	w.keyN += n
	return rt.Keys(w.keyN-n, n)
}

func (w *world) newReq(params string) *offload.ReqContext {
	w.t.Helper()
	w.reqN++
	req, err := w.cfg.Parser().NewReqContext(fmt.Sprintf("req-%d", w.reqN), params)
	if err != nil {
		w.t.Fatal(err)
	}
	if len(req.Warnings) > 0 {
		w.t.Fatalf("params %s: warnings %v", params, req.Warnings)
	}
	w.m.OnNewRequest(req)
	return req
}

// store writes keys into the primary as the engine would and completes
// the store, which cascades them; it returns once every cascade finished.
func (w *world) store(params string, keys []offload.Key) {
	w.t.Helper()
	req := w.newReq(params)
	out, ok, err := w.m.PrepareStore(keys, req)
	if err != nil || !ok || len(out.KeysToStore) != len(keys) {
		w.t.Fatalf("PrepareStore: ok %v, err %v, %d of %d keys", ok, err, len(out.KeysToStore), len(keys))
	}
	for i, s := range out.Slots {
		b, err := w.p.Arena().Slot(s)
		if err != nil {
			w.t.Fatal(err)
		}
		copy(b, bytes.Repeat([]byte(string(out.KeysToStore[i])), len(b)))
		w.data[out.KeysToStore[i]] = bytes.Clone(b)
	}
	if err := w.m.CompleteStore(out.KeysToStore, req, true); err != nil {
		w.t.Fatal(err)
	}
	w.m.OnRequestFinished(req)
	w.settle()
}

// lookup looks k up for a new request with params, step after step, until
// the answer is final: Hit (promoted into the primary; the bytes are then
// read and compared) or Miss. It returns the answer and the request id.
func (w *world) lookup(params string, k offload.Key) (offload.LookupResult, string) {
	w.t.Helper()
	req := w.newReq(params)
	defer w.m.OnRequestFinished(req)
	deadline := time.Now().Add(30 * time.Second)
	r := w.m.Lookup(k, req)
	for r == offload.Retry || r == offload.HitPending {
		if time.Now().After(deadline) {
			w.t.Fatalf("lookup of %s still %v after 30s", k, r)
		}
		w.m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
		r = w.m.Lookup(k, req)
	}
	if r == offload.Hit {
		slots, err := w.m.PrepareLoad([]offload.Key{k}, req)
		if err != nil {
			w.t.Fatal(err)
		}
		b, _ := w.p.Arena().Slot(slots[0])
		if !bytes.Equal(b, w.data[k]) {
			w.t.Errorf("block %s promoted with other bytes than were stored", k)
		}
		if err := w.m.CompleteLoad([]offload.Key{k}, req); err != nil {
			w.t.Fatal(err)
		}
	}
	return r, req.ID
}

// settle ends steps until the manager has no work in flight.
func (w *world) settle() {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.m.ScheduleEnd(offload.ScheduleEnd{})
		if !w.m.HasPendingWork() {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatal("manager still has pending work after 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

// reset empties the primary; the secondary tiers keep their blocks.
func (w *world) reset() {
	w.t.Helper()
	w.settle()
	if err := w.m.Reset(w.ctx); err != nil {
		w.t.Fatal(err)
	}
}

// holders returns the tiers whose store holds k, sorted, found by looking
// at the stores directly: the block file under the fs root, the object in
// the bucket, the key in redis. The fs file and the s3 object must have
// the same path below the root and the prefix (one layout, filled from
// the config's namespace).
func (w *world) holders(k offload.Key) []string {
	w.t.Helper()
	h := k.HexHash()
	rel := fmt.Sprintf("%s/%s_g0/%s.bin", h[:3], h[3:5], h)
	var out, paths []string

	files, err := filepath.Glob(filepath.Join(w.fsRoot, "it_model_*_r0", filepath.FromSlash(rel)))
	if err != nil {
		w.t.Fatal(err)
	}
	if len(files) > 1 {
		w.t.Fatalf("fs: %d files for %s: %v", len(files), k, files)
	}
	if len(files) == 1 {
		out = append(out, fsName)
		r, _ := filepath.Rel(w.fsRoot, files[0])
		paths = append(paths, filepath.ToSlash(r))
	}

	var objs []string
	p := awss3.NewListObjectsV2Paginator(w.s3, &awss3.ListObjectsV2Input{Bucket: aws.String(w.bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(w.ctx)
		if err != nil {
			w.t.Fatalf("list bucket %s: %v", w.bucket, err)
		}
		for _, o := range page.Contents {
			if key := aws.ToString(o.Key); strings.HasSuffix(key, "/"+rel) {
				objs = append(objs, key)
			}
		}
	}
	if len(objs) > 1 {
		w.t.Fatalf("s3: %d objects for %s: %v", len(objs), k, objs)
	}
	if len(objs) == 1 {
		out = append(out, s3Name)
		paths = append(paths, strings.TrimPrefix(objs[0], "it/"))
	}

	n, err := w.rdb.Exists(w.ctx, w.prefix+h+":0").Result()
	if err != nil {
		w.t.Fatalf("redis EXISTS: %v", err)
	}
	if n == 1 {
		out = append(out, redisName)
	}
	if len(paths) == 2 && paths[0] != paths[1] {
		w.t.Errorf("fs file %s and s3 object %s differ in layout", paths[0], paths[1])
	}
	slices.Sort(out)
	return out
}

// snap is the manager's per-tier stats and the spies' store counts.
type snap struct {
	tiers  []tiering.TierStats
	stores []int
}

func (w *world) snapshot() snap {
	s := snap{tiers: w.m.Stats().Tiers}
	for _, sp := range w.spies {
		s.stores = append(s.stores, sp.stores)
	}
	return s
}

// delta returns the growth of tier i's counters from a to b.
func delta(a, b snap, i int) tiering.TierStats {
	x, y := a.tiers[i], b.tiers[i]
	return tiering.TierStats{
		Name:                    y.Name,
		Hits:                    y.Hits - x.Hits,
		Misses:                  y.Misses - x.Misses,
		Retries:                 y.Retries - x.Retries,
		SkippedByFilter:         y.SkippedByFilter - x.SkippedByFilter,
		PromotionsStarted:       y.PromotionsStarted - x.PromotionsStarted,
		PromotionsOK:            y.PromotionsOK - x.PromotionsOK,
		PromotedBlocks:          y.PromotedBlocks - x.PromotedBlocks,
		CascadesOK:              y.CascadesOK - x.CascadesOK,
		CascadesFailed:          y.CascadesFailed - x.CascadesFailed,
		CascadesDropped:         y.CascadesDropped - x.CascadesDropped,
		CascadesSkippedByFilter: y.CascadesSkippedByFilter - x.CascadesSkippedByFilter,
		CascadedBlocks:          y.CascadedBlocks - x.CascadedBlocks,
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	if out == nil {
		out = []string{}
	}
	return out
}

// spy counts the manager's calls into a tier, independently of the
// manager's own statistics: lookups and loads per request, and stores.
type spy struct {
	offload.SecondaryTier
	lookups, loads map[string]int
	stores         int
}

func (s *spy) Lookup(k offload.Key, req *offload.ReqContext) offload.LookupResult {
	s.lookups[req.ID]++
	return s.SecondaryTier.Lookup(k, req)
}

func (s *spy) SubmitLoad(job *offload.Job) {
	if job.Req != nil {
		s.loads[job.Req.ID]++
	}
	s.SecondaryTier.SubmitLoad(job)
}

func (s *spy) SubmitStore(job *offload.Job) {
	s.stores++
	s.SecondaryTier.SubmitStore(job)
}

// Tenants' quota.tiers reach redis and s3 tiers with max_bytes as shares
// of their ledgers, which a tier built from the config reports.
func TestIntegrationTenantQuotasReachRemoteTiers(t *testing.T) {
	ep, ak, sk := os.Getenv("KVTIER_TEST_S3_ENDPOINT"), os.Getenv("KVTIER_TEST_S3_ACCESS_KEY"), os.Getenv("KVTIER_TEST_S3_SECRET_KEY")
	raddr := os.Getenv("KVTIER_TEST_REDIS_ADDR")
	if ep == "" || ak == "" || sk == "" || raddr == "" {
		requireIntegration(t, "KVTIER_TEST_S3_* and KVTIER_TEST_REDIS_ADDR")
	}
	bucket := "kvtier-quota-" + randomHex(6)
	cfg, err := config.Parse(fmt.Appendf(nil, `
secondary_tiers:
  - {name: objects, type: s3, bucket: %s, endpoint: %q, access_key: %q, secret_key: %q, create_bucket: true, max_bytes: 1GiB}
  - {name: dram, type: redis, addr: %q, key_prefix: %q, max_bytes: 512MiB}
tenants:
  - {name: acme, token: acme-token-0123456789, namespaces: [default], quota: {tiers: {objects: 100MiB, dram: 200MiB}}}
`, bucket, ep, ak, sk, raddr, "kvtier-quota-"+randomHex(6)+":"))
	if err != nil {
		t.Fatal(err)
	}
	tiers, err := tierset.Build(t.Context(), cfg, tierset.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, tier := range tiers {
			tier.Close(context.Background())
		}
		s3c := awss3.New(awss3.Options{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider(ak, sk, ""), UsePathStyle: true, BaseEndpoint: aws.String(ep)})
		s3c.DeleteBucket(context.Background(), &awss3.DeleteBucketInput{Bucket: aws.String(bucket)})
	}()
	acme, _ := keyspace.Tenant("acme")
	for i, want := range [][]offload.ShareReport{
		{{Space: 0, Quota: 924 << 20}, {Space: acme.ID(), Quota: 100 << 20}},
		{{Space: 0, Quota: 312 << 20}, {Space: acme.ID(), Quota: 200 << 20}},
	} {
		if got := tiers[i].(offload.Reporter).Report().Shares; !slices.Equal(got, want) {
			t.Errorf("tier %s: shares %+v, want %+v", tiers[i].Name(), got, want)
		}
	}
}
