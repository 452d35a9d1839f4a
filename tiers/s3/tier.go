package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// Type is the configured type name of the tier.
const Type = "s3"

// ErrBucketNotFound reports a configured bucket that does not exist (and
// create_bucket is off).
var ErrBucketNotFound = errors.New("bucket does not exist")

// ErrUnreachable reports an endpoint that did not answer at startup.
var ErrUnreachable = errors.New("endpoint unreachable")

// ErrNotFound reports a block the store does not hold.
var ErrNotFound = remote.ErrNotFound

// Tier is an S3-compatible object store as a STORAGE secondary tier. It
// implements offload.SecondaryTier; the embedded remote.Base does the
// bookkeeping common to remote tiers.
type Tier struct {
	*remote.Base
	cfg    Config
	prefix string
	log    *slog.Logger

	client *s3.Client
	httpc  *http.Client
	health *remote.Health
	// ioSem bounds PUT/GET/DELETE requests; headSem the existence checks,
	// so that probes are not stuck behind bulk transfers.
	ioSem, headSem chan struct{}

	events     *remote.Events     // nil when events are off
	recon      *remote.Reconciler // nil when events are off
	ctx        context.Context    // ends at Close: background loops
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	c          remote.Counters
	budget     *remote.Budget  // max_bytes' ledger; nil without
	retry      *remote.Retrier // transfers
	probeRetry *remote.Retrier // existence checks: shorter timeout

	closeOnce sync.Once
	closeErr  error
}

var _ offload.SecondaryTier = (*Tier)(nil)

// New validates cfg, connects, and checks that the bucket exists (creating
// it when cfg.CreateBucket is set). An unreachable endpoint or a missing
// bucket is an error naming the endpoint and bucket. ctx bounds the
// startup checks.
func New(ctx context.Context, cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	loc, _ := remote.ParseLocality(cfg.Locality)
	layout, err := cfg.layoutOf()
	if err != nil {
		return nil, fmt.Errorf("s3 tier %q: namespace: %w", cfg.Name, err)
	}
	cfg.Layout = layout
	t := &Tier{
		cfg:     cfg,
		prefix:  strings.TrimSuffix(cfg.Prefix, "/"),
		log:     cfg.Logger,
		ioSem:   make(chan struct{}, cfg.IOThreads),
		headSem: make(chan struct{}, cfg.IOThreads),
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	t.log = t.log.With("tier", cfg.Name, "type", Type)
	if cfg.Events {
		t.events = remote.NewEvents(cfg.Name, offload.MediumStorage, loc, 0)
	}
	t.httpc = cfg.HTTPClient
	if t.httpc == nil {
		t.httpc = newHTTPClient(cfg.IOThreads)
	}
	t.client = newClient(cfg, t.httpc)
	if t.budget, err = cfg.NewBudget(); err != nil {
		return nil, fmt.Errorf("%s: %w", t.label(), err)
	}

	if err := t.checkBucket(ctx); err != nil {
		t.httpc.CloseIdleConnections()
		return nil, err
	}

	t.health = remote.NewHealth(t.label(), t.probe, remote.HealthOptions{
		Threshold: cfg.UnhealthyAfter,
		Interval:  cfg.ProbeInterval,
		Timeout:   min(cfg.Timeout, 5*time.Second),
		Logger:    t.log,
		// Objects may have gone while the service was away.
		OnRecover: func(context.Context) { t.recon.Trigger() },
	})
	t.retry = &remote.Retrier{Timeout: cfg.Timeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify}
	t.probeRetry = &remote.Retrier{Timeout: cfg.LookupTimeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify}
	t.Base = remote.NewBase(remote.BaseConfig{
		Name:          cfg.Name,
		Label:         t.label(),
		Medium:        offload.MediumStorage,
		Locality:      loc,
		Health:        t.health,
		Counters:      &t.c,
		Events:        t.events,
		MaxInflight:   cfg.MaxInflight,
		Exists:        t.exists,
		LookupBatch:   cfg.LookupBatch,
		LookupTimeout: 4 * cfg.LookupTimeout,
		Logger:        t.log,
		Store:         t.store,
		Load:          t.load,
		Budget:        t.budget,
		Delete:        t.del,
	})
	// Lifecycle rules and other clients delete objects without telling
	// anyone: a periodic pass publishes those removals.
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.recon = remote.StartReconciler(t.ctx, &t.wg, remote.ReconcilerConfig{
		Events:   t.events,
		Check:    t.present,
		Options:  remote.ReconcileOptions{Batch: cfg.LookupBatch, Rate: cfg.ReconcileRate},
		Interval: cfg.ReconcileInterval,
		Healthy:  t.health.Healthy,
		Logger:   t.log,
	})
	if t.budget != nil {
		if err := t.budget.Fill(ctx, t.list, t.del, t.log); err != nil {
			t.Close(context.Background())
			return nil, fmt.Errorf("%s: %w", t.label(), err)
		}
	}
	return t, nil
}

// Stats returns the tier's counters and gauges.
func (t *Tier) Stats() remote.Stats {
	st := t.Base.Stats()
	rs := t.recon.Stats()
	st.Reconciles, st.ReconcileFailures, st.ReconciledRemovals = rs.Runs, rs.Failed, rs.Removed
	return st
}

// Report implements offload.Reporter.
func (t *Tier) Report() offload.TierReport {
	r := remote.ReportOf(t.Stats())
	t.budget.AddTo(&r)
	return r
}

// Reconcile runs one reconciliation pass now (see remote.Events.Reconcile)
// and returns how many keys it checked and removals it published.
func (t *Tier) Reconcile(ctx context.Context) (checked, removed int, err error) {
	return t.events.Reconcile(ctx, t.present, remote.ReconcileOptions{Batch: t.cfg.LookupBatch, Rate: t.cfg.ReconcileRate})
}

// present is the reconciliation check: like exists, but any failed HEAD
// fails the batch, because reconciliation must not take an error for a
// vanished object.
func (t *Tier) present(ctx context.Context, keys []offload.Key) ([]bool, error) {
	found, errs, err := t.heads(ctx, keys)
	if err == nil {
		err = errors.Join(errs...)
	}
	if err != nil {
		return nil, err
	}
	return found, nil
}

func (t *Tier) label() string { return fmt.Sprintf("s3 tier %q", t.cfg.Name) }

func newHTTPClient(ioThreads int) *http.Client {
	// Keep enough idle connections for every I/O and HEAD thread plus the
	// probe, so steady-state transfers never redial.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 2*ioThreads + 4
	tr.MaxIdleConnsPerHost = 2*ioThreads + 4
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return &http.Client{
		Transport: tr,
		// S3 answers redirects for a wrong region; surface them as errors.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func newClient(cfg Config, httpc *http.Client) *s3.Client {
	var creds aws.CredentialsProvider = aws.AnonymousCredentials{}
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)
	}
	return s3.New(s3.Options{
		Region:       cfg.Region,
		Credentials:  creds,
		UsePathStyle: true,
		BaseEndpoint: nonEmpty(cfg.Endpoint),
		HTTPClient:   httpc,
		// The tier retries itself, so that it can stop retrying as soon
		// as the server is marked down.
		Retryer: aws.NopRetryer{},
		// Blocks carry kvtier's own checksum; SDK checksums would hash
		// every 2 MiB block a second time.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return aws.String(s)
}

// checkBucket fails startup clearly when the endpoint does not answer or
// the bucket is missing.
func (t *Tier) checkBucket(ctx context.Context) error {
	where := t.cfg.Endpoint
	if where == "" {
		where = "AWS " + t.cfg.Region
	}
	hctx, cancel := context.WithTimeout(ctx, min(t.cfg.Timeout, 10*time.Second))
	_, err := t.client.HeadBucket(hctx, &s3.HeadBucketInput{Bucket: aws.String(t.cfg.Bucket)})
	cancel()
	if err == nil {
		return nil
	}
	status := httpStatus(err)
	switch {
	case status == http.StatusNotFound && t.cfg.CreateBucket:
		in := &s3.CreateBucketInput{Bucket: aws.String(t.cfg.Bucket)}
		if t.cfg.Region != DefaultRegion {
			in.CreateBucketConfiguration = &types.CreateBucketConfiguration{
				LocationConstraint: types.BucketLocationConstraint(t.cfg.Region),
			}
		}
		cctx, cancel := context.WithTimeout(ctx, min(t.cfg.Timeout, 10*time.Second))
		defer cancel()
		if _, err := t.client.CreateBucket(cctx, in); err != nil {
			return fmt.Errorf("%s: create bucket %q at %s: %w", t.label(), t.cfg.Bucket, where, err)
		}
		t.log.Info("created bucket", "bucket", t.cfg.Bucket, "endpoint", where)
		return nil
	case status == http.StatusNotFound:
		return fmt.Errorf("%s: bucket %q at %s: %w (set create_bucket: true to create it)", t.label(), t.cfg.Bucket, where, ErrBucketNotFound)
	case status != 0:
		return fmt.Errorf("%s: bucket %q at %s: HTTP %d: %w", t.label(), t.cfg.Bucket, where, status, err)
	}
	return fmt.Errorf("%s: %s: %w: %w", t.label(), where, ErrUnreachable, err)
}

// probe is the health check while the service is marked down.
func (t *Tier) probe(ctx context.Context) error {
	_, err := t.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(t.cfg.Bucket)})
	return err
}

// Type returns "s3".
func (t *Tier) Type() string { return Type }

// Touch renews keys in the max_bytes ledger; without max_bytes it is a
// no-op: object stores keep no recency, and capacity is the bucket's
// lifecycle policy (see the package documentation).
func (t *Tier) Touch(keys []offload.Key, _ *offload.ReqContext) {
	if t.budget != nil {
		t.budget.Touch(keys)
	}
}

// Close cancels running transfers, waits for them until ctx ends, answers
// every outstanding job, and releases connections. It is idempotent.
func (t *Tier) Close(ctx context.Context) error {
	t.closeOnce.Do(func() {
		t.closeErr = t.Base.Close(ctx)
		t.cancel()
		t.wg.Wait()
		t.httpc.CloseIdleConnections()
	})
	return t.closeErr
}

// exists is the asynclookup batch function: concurrent HEADs, one per
// key. A failed check is a miss for that key; the batch never fails as a
// whole unless the service is down.
func (t *Tier) exists(ctx context.Context, keys []offload.Key) ([]bool, error) {
	found, _, err := t.heads(ctx, keys)
	return found, err
}

// heads HEADs every key concurrently (at most io_threads at once) and
// returns which exist and each check's error; err is set when the
// service is down and nothing was asked.
func (t *Tier) heads(ctx context.Context, keys []offload.Key) (found []bool, errs []error, err error) {
	if !t.health.Healthy() {
		return nil, nil, fmt.Errorf("%s: %w", t.label(), remote.ErrUnavailable)
	}
	found = make([]bool, len(keys))
	errs = remote.ForEach(ctx, t.headSem, len(keys), func(ctx context.Context, i int) error {
		t.c.Probes.Add(1)
		ok, err := t.head(ctx, t.probeRetry, keys[i], 0)
		if err != nil {
			t.c.ProbeErrors.Add(1)
		}
		found[i] = ok
		return err
	})
	return found, errs, nil
}

// head reports whether the object of k exists.
func (t *Tier) head(ctx context.Context, r *remote.Retrier, k offload.Key, retries int) (bool, error) {
	okey := objectKey(t.prefix, t.cfg.Layout, k)
	err := t.doWith(ctx, r, retries, func(ctx context.Context) error {
		_, err := t.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(t.cfg.Bucket), Key: aws.String(okey)})
		return err
	})
	if err == nil {
		return true, nil
	}
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return false, fmt.Errorf("%s: head %s: %w", t.label(), k, err)
}

// store uploads the job's blocks concurrently, skipping objects that
// exist and blocks the manager takes back, and returns the first error.
func (t *Tier) store(ctx context.Context, job *offload.Job) ([]remote.Fate, error) {
	var fates []remote.Fate
	if job.Claims != nil {
		fates = make([]remote.Fate, len(job.Keys))
	}
	errs := remote.ForEach(ctx, t.ioSem, len(job.Keys), func(ctx context.Context, i int) error {
		return t.storeBlock(ctx, job, i, fates)
	})
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return fates, nil
}

// storeBlock uploads block i of job; its slot is read, claimed, for the
// upload's duration (retries included).
func (t *Tier) storeBlock(ctx context.Context, job *offload.Job, i int, fates []remote.Fate) error {
	k := job.Keys[i]
	if i >= len(job.Slots) {
		return fmt.Errorf("%s: store %s: job has %d slots for %d keys", t.label(), k, len(job.Slots), len(job.Keys))
	}
	if !k.Valid() {
		return fmt.Errorf("%s: store: %w", t.label(), offload.ErrInvalidKey)
	}
	slot, err := job.Arena.Slot(job.Slots[i])
	if err != nil {
		return fmt.Errorf("%s: store %s: %w", t.label(), k, err)
	}
	exists, err := t.head(ctx, t.retry, k, t.cfg.Retries)
	if err != nil {
		return err
	}
	if exists {
		t.c.BlocksExisted.Add(1)
		return nil
	}
	if !job.Claim(i) {
		fates[i] = remote.TakenBack
		return nil
	}
	defer job.Release(i)
	var hdr [remote.HeaderSize]byte
	remote.PutHeader(hdr[:], k, slot)
	okey := objectKey(t.prefix, t.cfg.Layout, k)
	err = t.do(ctx, t.cfg.Retries, func(ctx context.Context) error {
		body := remote.NewBody(hdr[:], slot)
		_, err := t.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:        aws.String(t.cfg.Bucket),
			Key:           aws.String(okey),
			Body:          body,
			ContentLength: aws.Int64(body.Len()),
			ContentType:   aws.String("application/octet-stream"),
		}, s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: put %s: %w", t.label(), k, err)
	}
	t.c.BlocksStored.Add(1)
	t.c.BytesWritten.Add(int64(len(slot)))
	return nil
}

// load downloads the blocks that have a slot concurrently, each straight
// into its slot.
func (t *Tier) load(ctx context.Context, job *offload.Job, slots [][]byte, errs []error) {
	idx := make([]int, 0, len(slots))
	for i, s := range slots {
		if s != nil {
			idx = append(idx, i)
		}
	}
	done := remote.ForEach(ctx, t.ioSem, len(idx), func(ctx context.Context, j int) error {
		return t.loadBlock(ctx, job.Keys[idx[j]], slots[idx[j]])
	})
	for j, i := range idx {
		errs[i] = done[j]
	}
}

func (t *Tier) loadBlock(ctx context.Context, k offload.Key, slot []byte) error {
	okey := objectKey(t.prefix, t.cfg.Layout, k)
	err := t.do(ctx, t.cfg.Retries, func(ctx context.Context) error {
		return t.get(ctx, okey, k, slot)
	})
	switch {
	case err == nil:
		t.c.BlocksLoaded.Add(1)
		t.c.BytesRead.Add(int64(len(slot)))
		return nil
	case errors.Is(err, remote.ErrCorrupt):
		t.c.Corrupted.Add(1)
		t.log.Warn("corrupt block deleted", "key", k.String(), "object", okey, "err", err)
		t.deleteCorrupt(ctx, okey, k)
	case errors.Is(err, remote.ErrSizeMismatch):
		t.c.SizeMismatch.Add(1)
	}
	return fmt.Errorf("%s: load %s: %w", t.label(), k, err)
}

// get streams the object of k straight into slot and verifies it. On an
// error slot holds garbage, which is fine: the primary never exposes the
// slot of a failed promotion.
func (t *Tier) get(ctx context.Context, okey string, k offload.Key, slot []byte) error {
	out, err := t.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(t.cfg.Bucket), Key: aws.String(okey)})
	if err != nil {
		return err
	}
	defer out.Body.Close()
	size := int64(-1)
	if out.ContentLength != nil {
		size = *out.ContentLength
	}
	var hb [remote.HeaderSize]byte
	if _, err := io.ReadFull(out.Body, hb[:]); err != nil {
		return truncated(err, size, remote.HeaderSize)
	}
	h, err := remote.ParseHeader(hb[:], k)
	if err != nil {
		return err
	}
	want := int64(remote.HeaderSize) + int64(h.Len)
	if size >= 0 && size != want {
		return fmt.Errorf("%w: object is %d bytes, header announces %d", remote.ErrCorrupt, size, want)
	}
	if err := h.CheckLen(len(slot)); err != nil {
		return err
	}
	if _, err := io.ReadFull(out.Body, slot); err != nil {
		return truncated(err, size, want)
	}
	var one [1]byte
	if n, _ := out.Body.Read(one[:]); n != 0 {
		return fmt.Errorf("%w: trailing bytes after the payload", remote.ErrCorrupt)
	}
	return h.Verify(slot)
}

// truncated classifies a short body: when the object itself is shorter
// than needed it is corrupt; when the server announced enough bytes the
// connection broke, which is transient.
func truncated(err error, size, need int64) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		if size >= 0 && size < need || size < 0 {
			return fmt.Errorf("%w: object truncated (%d bytes)", remote.ErrCorrupt, size)
		}
	}
	return err
}

// deleteCorrupt removes a block that failed verification so no one reads
// it again, and reports it removed.
func (t *Tier) deleteCorrupt(ctx context.Context, okey string, k offload.Key) {
	err := t.do(ctx, 0, func(ctx context.Context) error {
		_, err := t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(t.cfg.Bucket), Key: aws.String(okey)})
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.log.Warn("deleting corrupt block failed", "key", k.String(), "object", okey, "err", err)
		return
	}
	t.c.Deleted.Add(1)
	t.events.Removed([]offload.Key{k})
}

// do runs one request through the retrier; a 404 comes back wrapped in
// ErrNotFound.
func (t *Tier) do(ctx context.Context, retries int, op func(ctx context.Context) error) error {
	return t.doWith(ctx, t.retry, retries, op)
}

func (t *Tier) doWith(ctx context.Context, r *remote.Retrier, retries int, op func(ctx context.Context) error) error {
	err := r.Do(ctx, retries, op)
	if err != nil && httpStatus(err) == http.StatusNotFound {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// classify: any HTTP answer below 500 (except 408 and 429) and kvtier's
// own verification errors show a working service; everything else is
// transient.
func classify(err error) remote.Class {
	status := httpStatus(err)
	switch {
	case status != 0 && status < 500 && status != http.StatusTooManyRequests && status != http.StatusRequestTimeout:
		return remote.Answered
	case status == 0 && (errors.Is(err, remote.ErrCorrupt) || errors.Is(err, remote.ErrSizeMismatch)):
		return remote.Answered
	}
	return remote.Transient
}

// httpStatus returns the HTTP status of a service error, or 0 when the
// request got no response.
func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// Keep passes over the blocks keep reports when max_bytes makes the tier
// choose victims (offload.Keeper: routers' pins); without max_bytes it
// chooses none.
func (t *Tier) Keep(keep func(offload.Key) bool) {
	if t.budget != nil {
		t.budget.Keep(keep)
	}
}
