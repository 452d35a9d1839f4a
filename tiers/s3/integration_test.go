package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
	"github.com/kvtier/kvtier/tiers/remote"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// Integration tests run against a real S3 service (versitygw in the test
// script) named by KVTIER_TEST_S3_ENDPOINT, _ACCESS_KEY and _SECRET_KEY.
// Without them they skip, unless KVTIER_REQUIRE_INTEGRATION=1.

func realS3Config(t *testing.T) Config {
	t.Helper()
	ep := os.Getenv("KVTIER_TEST_S3_ENDPOINT")
	ak, sk := os.Getenv("KVTIER_TEST_S3_ACCESS_KEY"), os.Getenv("KVTIER_TEST_S3_SECRET_KEY")
	if ep == "" || ak == "" || sk == "" {
		rt.RequireIntegration(t, "KVTIER_TEST_S3_ENDPOINT/ACCESS_KEY/SECRET_KEY")
	}
	cfg := DefaultConfig()
	cfg.Name = "s3-it"
	cfg.Endpoint = ep
	cfg.AccessKey, cfg.SecretKey = ak, sk
	cfg.Bucket = rt.UniqueName()
	cfg.CreateBucket = true
	cfg.Locality = "remote"
	cfg.Events = true
	cfg.Prefix = "it"
	cfg.Layout = Layout{Base: "test-model_0123456789ab", Rank: 0}
	cfg.ProbeInterval = 50 * time.Millisecond
	cfg.RetryBackoff = 5 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	t.Cleanup(func() { removeBucket(cfg) })
	return cfg
}

// removeBucket deletes the test bucket and its objects (best effort), so
// a shared test server does not accumulate buckets.
func removeBucket(cfg Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := rawClient(cfg)
	p := s3.NewListObjectsV2Paginator(raw, &s3.ListObjectsV2Input{Bucket: aws.String(cfg.Bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return
		}
		for _, o := range page.Contents {
			raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(cfg.Bucket), Key: o.Key})
		}
	}
	raw.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(cfg.Bucket)})
}

func TestIntegrationRoundTrip2MiB(t *testing.T) {
	cfg := realS3Config(t)
	tier := newTier(t, cfg)
	const slot = 2 << 20
	const n = 6
	src := rt.NewArena(slot, n)
	for i := 0; i < n; i++ {
		src.Fill(int64(i), uint64(1000+i))
	}
	keys := rt.Keys(500, n)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, n))); !res.Success || res.Bytes != n*slot {
		t.Fatalf("store %+v", res)
	}
	if evs := tier.TakeEvents(); len(evs) != 1 || len(evs[0].Keys) != n {
		t.Fatalf("events %+v", evs)
	}
	req, _ := offload.NewReqContext("it", nil)
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req); r != offload.Hit {
			t.Fatalf("lookup %s: %v", k, r)
		}
	}
	dst := rt.NewArena(slot, n)
	if res := rt.Run(t, tier, rt.LoadJob(2, dst, keys, rt.Slots(0, n), req)); !res.Success {
		t.Fatalf("load %+v", res)
	}
	for i := 0; i < n; i++ {
		a, _ := src.Slot(int64(i))
		b, _ := dst.Slot(int64(i))
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d differs", i)
		}
	}
	// Objects follow the FS layout under the prefix.
	okey := fmt.Sprintf("it/test-model_0123456789ab_r0/%s/%s_g0/%s.bin", keys[0].HexHash()[:3], keys[0].HexHash()[3:5], keys[0].HexHash())
	out, err := rawClient(cfg).HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(okey)})
	if err != nil || aws.ToInt64(out.ContentLength) != slot+remote.HeaderSize {
		t.Fatalf("object %s: %v %+v", okey, err, out)
	}
}

// A block the manager takes back before the tier reads it is not
// uploaded.
func TestIntegrationTakenBack(t *testing.T) {
	tier := newTier(t, realS3Config(t))
	rt.CheckTakenBack(t, tier, rt.NewArena(4096, 3), rt.Keys(700, 3), true)
}

func TestIntegrationCorruptObject(t *testing.T) {
	cfg := realS3Config(t)
	tier := newTier(t, cfg)
	raw := rawClient(cfg)
	const slot = 256 << 10
	src := rt.NewArena(slot, 1)
	src.Fill(0, 42)
	keys := rt.Keys(7, 1)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, []int64{0})); !res.Success {
		t.Fatal(res)
	}
	ctx := context.Background()
	okey := objectKey(cfg.Prefix, cfg.Layout, keys[0])
	out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(okey)})
	if err != nil {
		t.Fatal(err)
	}
	good, _ := io.ReadAll(out.Body)
	out.Body.Close()
	good[len(good)/2] ^= 0x40
	if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(okey), Body: bytes.NewReader(good)}); err != nil {
		t.Fatal(err)
	}
	req, _ := offload.NewReqContext("c", nil)
	if r := rt.Resolve(t, tier, keys[0], req); r != offload.Hit {
		t.Fatalf("lookup %v", r)
	}
	res := rt.Run(t, tier, rt.LoadJob(2, rt.NewArena(slot, 1), keys, []int64{0}, req))
	if res.Success || !errors.Is(res.Err, remote.ErrCorrupt) {
		t.Fatalf("load %+v", res)
	}
	if r := tier.Lookup(keys[0], req); r != offload.Miss {
		t.Fatalf("lookup after corrupt load %v", r)
	}
	if _, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(okey)}); httpStatus(err) != http.StatusNotFound {
		t.Fatalf("not deleted: %v", err)
	}
	if st := tier.Stats(); st.Corrupted != 1 || st.Deleted != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// versitygwBinary finds the versitygw binary: $KVTIER_TEST_VERSITYGW, the
// repository's .tools/bin, or PATH.
func versitygwBinary() string {
	if p := os.Getenv("KVTIER_TEST_VERSITYGW"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../../.tools/bin/versitygw"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	return ""
}

// versity is a versitygw process the test owns, restartable on its port.
type versity struct {
	*rt.Process
	addr   string
	ak, sk string
}

func startVersity(t testing.TB) *versity {
	t.Helper()
	bin := versitygwBinary()
	if bin == "" {
		rt.RequireIntegration(t, "the versitygw binary (KVTIER_TEST_VERSITYGW or .tools/bin/versitygw)")
	}
	v := &versity{addr: rt.FreeAddr(t), ak: "itAK", sk: "itSKitSKitSK"}
	args := []string{bin, "--port", v.addr, "--access", v.ak, "--secret", v.sk, "--quiet", "posix", t.TempDir()}
	v.Process = rt.StartProcess(t, "versitygw", args, func() error {
		c, err := net.DialTimeout("tcp", v.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	}, 20*time.Second)
	return v
}

func TestIntegrationServerStoppedAndRestarted(t *testing.T) {
	v := startVersity(t)
	cfg := DefaultConfig()
	cfg.Name = "s3-restart"
	cfg.Endpoint = "http://" + v.addr
	cfg.AccessKey, cfg.SecretKey = v.ak, v.sk
	cfg.Bucket = rt.UniqueName()
	cfg.CreateBucket = true
	cfg.Locality = "remote"
	cfg.Timeout = 2 * time.Second
	cfg.Retries = 1
	cfg.RetryBackoff = 5 * time.Millisecond
	cfg.ProbeInterval = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	tier := newTier(t, cfg)

	const slot = 1 << 20
	arena := rt.NewArena(slot, 8)
	for i := 0; i < 8; i++ {
		arena.Fill(int64(i), uint64(i))
	}
	keys := rt.Keys(0, 4)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, rt.Slots(0, 4))); !res.Success {
		t.Fatalf("store before stop %+v", res)
	}

	v.Stop()
	rt.StoreUntilDown(t, tier, arena, 4, 10, 20*time.Second)
	req, _ := offload.NewReqContext("down", nil)
	if r := tier.Lookup(keys[0], req); r != offload.Miss {
		t.Fatalf("lookup while down %v", r)
	}
	tier.SubmitStore(rt.StoreJob(100, arena, rt.Keys(100, 1), []int64{5}))
	if r := rt.WaitJobs(t, tier, 1, 10*time.Second)[0]; !errors.Is(r.Err, remote.ErrUnavailable) {
		t.Fatalf("cascade while down %+v", r)
	}
	if st := tier.Stats(); st.Healthy || st.StoreJobsSkipped < 1 || st.LookupsUnhealthy < 1 {
		t.Fatalf("stats while down %+v", st)
	}

	v.Start()
	rt.Eventually(t, 20*time.Second, "tier healthy after restart", tier.Healthy)
	req2, _ := offload.NewReqContext("up", nil)
	if r := rt.Resolve(t, tier, keys[0], req2); r != offload.Hit {
		t.Fatalf("lookup after restart %v", r)
	}
	dst := rt.NewArena(slot, 4)
	if res := rt.Run(t, tier, rt.LoadJob(200, dst, keys, rt.Slots(0, 4), req2)); !res.Success {
		t.Fatalf("load after restart %+v", res)
	}
	for i := 0; i < 4; i++ {
		a, _ := arena.Slot(int64(i))
		b, _ := dst.Slot(int64(i))
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d differs after restart", i)
		}
	}
}

func TestIntegrationManagerOutage(t *testing.T) {
	v := startVersity(t)
	cfg := testConfig("http://" + v.addr)
	cfg.AccessKey, cfg.SecretKey = v.ak, v.sk
	cfg.Bucket = rt.UniqueName()
	cfg.CreateBucket = true
	cfg.Retries = 1
	tier := newTier(t, cfg)
	rt.RunManagerOutage(t, rt.ManagerCase{Tier: tier}, rt.Outage{Stop: v.Stop, Start: v.Start, Healthy: tier.Healthy})
}

func TestIntegrationDeleteThroughManager(t *testing.T) {
	rt.RunManagerDelete(t, rt.ManagerCase{Tier: newTier(t, realS3Config(t))})
}

func TestIntegrationThroughManager(t *testing.T) {
	tier := newTier(t, realS3Config(t))
	rt.RunManager(t, rt.ManagerCase{Tier: tier, ExcludeLoad: `{"kv_load_tiers": [{"locality": "local"}]}`})
}

// TestIntegrationStartupErrors: against the real service, a missing
// bucket fails New with ErrBucketNotFound unless create_bucket is set,
// and wrong credentials fail it with the service's answer.
func TestIntegrationStartupErrors(t *testing.T) {
	cfg := realS3Config(t)
	cfg.CreateBucket = false
	_, err := New(context.Background(), cfg)
	if !errors.Is(err, ErrBucketNotFound) || !strings.Contains(err.Error(), cfg.Bucket) {
		t.Fatalf("missing bucket: %v, want ErrBucketNotFound naming %s", err, cfg.Bucket)
	}
	cfg.CreateBucket = true
	cfg.SecretKey = "not-the-secret"
	_, err = New(context.Background(), cfg)
	if err == nil || errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("wrong credentials: %v, want HTTP 403", err)
	}
	cfg = realS3Config(t)
	tier := newTier(t, cfg) // create_bucket
	if !tier.Healthy() {
		t.Fatal("tier on a created bucket unhealthy")
	}
}

// Objects deleted behind the tier's back (another client, a lifecycle
// rule) are published as removed by a reconciliation pass — the periodic
// one and an explicit one — and only those.
func TestIntegrationReconcileVanishedObjects(t *testing.T) {
	cfg := realS3Config(t)
	cfg.ReconcileInterval = 50 * time.Millisecond
	tier := newTier(t, cfg)
	raw := rawClient(cfg)
	ctx := context.Background()
	arena := rt.NewArena(4096, 6)
	keys := rt.Keys(0, 6)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, rt.Slots(0, 6))); !res.Success {
		t.Fatal(res)
	}
	deleted := map[offload.Key]bool{}
	for _, k := range keys[:3] {
		if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(objectKey(cfg.Prefix, cfg.Layout, k))}); err != nil {
			t.Fatal(err)
		}
		deleted[k] = true
	}
	got := map[offload.Key]bool{}
	rt.Eventually(t, 20*time.Second, "removals of the deleted objects", func() bool {
		for _, ev := range tier.TakeEvents() {
			if ev.Removed {
				for _, k := range ev.Keys {
					if !deleted[k] || got[k] {
						t.Fatalf("removal of %s (deleted %v, reported before %v)", k, deleted[k], got[k])
					}
					got[k] = true
				}
			}
		}
		return len(got) == len(deleted)
	})
	// The rest are still there: an explicit pass removes nothing.
	if checked, removed, err := tier.Reconcile(ctx); err != nil || removed != 0 || checked != 3 {
		t.Fatalf("pass checked %d removed %d (%v); want 3, 0", checked, removed, err)
	}
	if st := tier.Stats(); st.ReconciledRemovals != 3 || st.Reconciles == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestIntegrationBudget: max_bytes and tenants' quotas on a real S3
// service (remotetest.RunBudget).
func TestIntegrationBudget(t *testing.T) {
	base := realS3Config(t)
	rt.RunBudget(t, rt.BudgetCase{
		New: func(ctx context.Context, maxBytes int64, shares []quota.Share) (offload.SecondaryTier, error) {
			cfg := base
			cfg.MaxBytes, cfg.Shares = confvalue.ByteSize(maxBytes), shares
			return New(ctx, cfg)
		},
		Held: func(t testing.TB) []offload.Key {
			var out []offload.Key
			dir := base.Prefix + "/" + filemapper.RankDir(base.Layout.Base, base.Layout.Rank) + "/"
			p := s3.NewListObjectsV2Paginator(rawClient(base), &s3.ListObjectsV2Input{Bucket: aws.String(base.Bucket)})
			for p.HasMorePages() {
				page, err := p.NextPage(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range page.Contents {
					if k, ok := filemapper.ParseRelPath(strings.TrimPrefix(aws.ToString(o.Key), dir)); ok {
						out = append(out, k)
					}
				}
			}
			return out
		},
	})
}
