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

	"github.com/kvtier/kvtier/asynclookup"
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
var ErrNotFound = errors.New("block not found")

// Tier is an S3-compatible object store as a STORAGE secondary tier. It
// implements offload.SecondaryTier.
type Tier struct {
	cfg      Config
	name     string
	locality offload.Locality
	prefix   string
	log      *slog.Logger

	client  *s3.Client
	httpc   *http.Client
	health  *remote.Health
	jobs    *remote.Jobs
	lookups *asynclookup.Manager
	// ioSem bounds PUT/GET/DELETE requests; headSem the existence checks,
	// so that probes are not stuck behind bulk transfers.
	ioSem, headSem chan struct{}

	events         *remote.Events // nil when events are off
	missQ, forgetQ remote.KeyQueue
	c              remote.Counters
	retry          *remote.Retrier // transfers
	probeRetry     *remote.Retrier // existence checks: shorter timeout

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
	loc, _ := parseLocality(cfg.Locality)
	layout, err := cfg.layoutOf()
	if err != nil {
		return nil, fmt.Errorf("s3 tier %q: namespace: %w", cfg.Name, err)
	}
	cfg.Layout = layout
	t := &Tier{
		cfg:      cfg,
		name:     cfg.Name,
		locality: loc,
		prefix:   strings.TrimSuffix(cfg.Prefix, "/"),
		log:      cfg.Logger,
		ioSem:    make(chan struct{}, cfg.IOThreads),
		headSem:  make(chan struct{}, cfg.IOThreads),
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	t.log = t.log.With("tier", cfg.Name, "type", Type)
	if cfg.Events {
		t.events = remote.NewEvents(0)
	}
	t.httpc = cfg.HTTPClient
	if t.httpc == nil {
		t.httpc = newHTTPClient(cfg.IOThreads)
	}
	t.client = newClient(cfg, t.httpc)

	if err := t.checkBucket(ctx); err != nil {
		t.httpc.CloseIdleConnections()
		return nil, err
	}

	t.health = remote.NewHealth(t.label(), t.probe, remote.HealthOptions{
		Threshold: cfg.UnhealthyAfter,
		Interval:  cfg.ProbeInterval,
		Timeout:   min(cfg.Timeout, 5*time.Second),
		Logger:    t.log,
	})
	t.retry = &remote.Retrier{Timeout: cfg.Timeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify}
	t.probeRetry = &remote.Retrier{Timeout: cfg.LookupTimeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify}
	t.jobs = remote.NewJobs(t.label(), cfg.MaxInflight)
	t.lookups = asynclookup.New(t.label(), t.exists, asynclookup.Options{
		MaxBatch: cfg.LookupBatch,
		Timeout:  4 * cfg.LookupTimeout,
		Logger:   t.log,
	})
	return t, nil
}

func (t *Tier) label() string { return fmt.Sprintf("s3 tier %q", t.name) }

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

// Name returns the configured tier name.
func (t *Tier) Name() string { return t.name }

// Type returns "s3".
func (t *Tier) Type() string { return Type }

// Medium returns STORAGE.
func (t *Tier) Medium() offload.Medium { return offload.MediumStorage }

// Locality returns the configured locality.
func (t *Tier) Locality() offload.Locality { return t.locality }

// Healthy reports whether the service is considered up.
func (t *Tier) Healthy() bool { return t.health.Healthy() }

// Stats returns the tier's counters and gauges.
func (t *Tier) Stats() remote.Stats {
	s := t.c.Snapshot()
	s.Healthy = t.health.Healthy()
	s.Downs = t.health.Downs()
	s.InFlightJobs = t.jobs.Active()
	if t.events != nil {
		s.EventsDropped = t.events.Dropped()
	}
	return s
}

// Lookup answers from the batched existence checks: Retry until the
// check of key has run, then Hit or Miss. While the service is down it
// answers Miss without queueing anything.
func (t *Tier) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	t.c.Lookups.Add(1)
	if !t.health.Healthy() {
		t.c.LookupsUnhealthy.Add(1)
		return offload.Miss
	}
	return t.lookups.Lookup(key, reqID(req))
}

func reqID(req *offload.ReqContext) string {
	if req == nil {
		return ""
	}
	return req.ID
}

// SubmitStore uploads the job's slots, skipping objects that exist. While
// the service is down the job fails at once (a skipped cascade).
func (t *Tier) SubmitStore(job *offload.Job) {
	if !t.health.Healthy() {
		t.c.StoreJobsSkipped.Add(1)
		t.jobs.Fail(job, fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, remote.ErrUnavailable))
		return
	}
	if !t.jobs.Submit(job, t.runStore) {
		t.c.StoreJobsSkipped.Add(1)
	}
}

// SubmitLoad downloads the job's blocks into its slots, verifying each.
// While the service is down the job fails at once and its keys answer
// Miss for the request.
func (t *Tier) SubmitLoad(job *offload.Job) {
	if !t.health.Healthy() {
		t.c.LoadJobsSkipped.Add(1)
		t.lookups.MarkMiss(job.Keys)
		t.jobs.Fail(job, fmt.Errorf("%s: load job %d: %w", t.label(), job.ID, remote.ErrUnavailable))
		return
	}
	if !t.jobs.Submit(job, t.runLoad) {
		t.c.LoadJobsSkipped.Add(1)
		t.lookups.MarkMiss(job.Keys)
	}
}

// FinishedJobs returns the results available since the previous call.
func (t *Tier) FinishedJobs() []offload.JobResult {
	res := t.jobs.Take()
	// Taken after the results: every result above queued its keys first.
	t.applyQueues()
	return res
}

func (t *Tier) applyQueues() {
	if keys := t.missQ.Take(); len(keys) > 0 {
		t.lookups.MarkMiss(keys)
	}
	if keys := t.forgetQ.Take(); len(keys) > 0 {
		t.lookups.Forget(keys)
	}
}

// DrainJobs waits until every submitted job has a result.
func (t *Tier) DrainJobs(ctx context.Context) error { return t.jobs.Drain(ctx) }

// HasPendingWork reports jobs in flight, results not yet taken, or
// existence checks queued or in flight.
func (t *Tier) HasPendingWork() bool { return t.jobs.Pending() || t.lookups.Pending() }

// Touch is a no-op: object stores keep no recency; capacity is the
// bucket's lifecycle policy (see the package documentation).
func (t *Tier) Touch([]offload.Key, *offload.ReqContext) {}

// OnNewRequest answers BlockLevel.
func (t *Tier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy { return offload.BlockLevel }

// OnRequestFinished drops the request's lookup state.
func (t *Tier) OnRequestFinished(req *offload.ReqContext) { t.lookups.Cleanup(reqID(req)) }

// OnScheduleEnd sends this step's existence checks as one batch.
func (t *Tier) OnScheduleEnd(offload.ScheduleEnd) {
	t.applyQueues()
	t.lookups.Flush()
}

// TakeEvents returns the events since the previous call (none when
// events are off).
func (t *Tier) TakeEvents() []offload.Event {
	if t.events == nil {
		return nil
	}
	return t.events.Take()
}

// Close cancels running transfers, waits for them until ctx ends, answers
// every outstanding job, and releases connections. It is idempotent.
func (t *Tier) Close(ctx context.Context) error {
	t.closeOnce.Do(func() {
		t.closeErr = t.jobs.Close(ctx)
		t.lookups.Close()
		t.health.Close()
		t.httpc.CloseIdleConnections()
	})
	return t.closeErr
}

// exists is the asynclookup batch function: concurrent HEADs, one per
// key. A failed check is a miss for that key; the batch never fails as a
// whole unless the service is down.
func (t *Tier) exists(ctx context.Context, keys []offload.Key) ([]bool, error) {
	if !t.health.Healthy() {
		return nil, fmt.Errorf("%s: %w", t.label(), remote.ErrUnavailable)
	}
	found := make([]bool, len(keys))
	remote.ForEach(ctx, t.headSem, len(keys), func(ctx context.Context, i int) error {
		t.c.Probes.Add(1)
		ok, err := t.head(ctx, t.probeRetry, keys[i], 0)
		if err != nil {
			t.c.ProbeErrors.Add(1)
		}
		found[i] = ok
		return err
	})
	return found, nil
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

func (t *Tier) runStore(ctx context.Context, job *offload.Job) offload.JobResult {
	start := time.Now()
	if job.Arena == nil && len(job.Keys) > 0 {
		t.c.StoreJobsFailed.Add(1)
		return offload.JobResult{Err: fmt.Errorf("%s: store job %d: no arena", t.label(), job.ID)}
	}
	errs := remote.ForEach(ctx, t.ioSem, len(job.Keys), func(ctx context.Context, i int) error {
		return t.storeBlock(ctx, job, i)
	})
	var firstErr error
	for _, err := range errs {
		if err != nil {
			firstErr = err
			break
		}
	}
	res := offload.JobResult{Duration: time.Since(start)}
	if len(job.Keys) == 0 {
		t.c.StoreJobsOK.Add(1)
		res.Success = true
		return res
	}
	if firstErr != nil {
		t.c.StoreJobsFailed.Add(1)
		res.Err = firstErr
		return res
	}
	res.Success = true
	res.Bytes = int64(len(job.Keys)) * int64(job.Arena.SlotSize())
	t.c.StoreJobsOK.Add(1)
	t.forgetQ.Add(job.Keys...)
	if t.events != nil {
		t.events.Add(offload.Event{Keys: job.Keys, Medium: offload.MediumStorage, Locality: t.locality, Tier: t.name})
	}
	return res
}

func (t *Tier) storeBlock(ctx context.Context, job *offload.Job, i int) error {
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

func (t *Tier) runLoad(ctx context.Context, job *offload.Job) offload.JobResult {
	start := time.Now()
	if job.Arena == nil && len(job.Keys) > 0 {
		t.c.LoadJobsFailed.Add(1)
		t.missQ.Add(job.Keys...)
		return offload.JobResult{Err: fmt.Errorf("%s: load job %d: no arena", t.label(), job.ID)}
	}
	errs := remote.ForEach(ctx, t.ioSem, len(job.Keys), func(ctx context.Context, i int) error {
		return t.loadBlock(ctx, job, i)
	})
	loaded, err := remote.Prefix(job.Keys, errs)
	res := offload.JobResult{Duration: time.Since(start)}
	if len(loaded) > 0 {
		res.Bytes = int64(len(loaded)) * int64(job.Arena.SlotSize())
	}
	if err == nil {
		t.c.LoadJobsOK.Add(1)
		res.Success = true
		return res
	}
	t.c.LoadJobsFailed.Add(1)
	res.Err = err
	res.SuccessfulKeys = loaded
	var failed []offload.Key
	for i, e := range errs {
		if e != nil {
			failed = append(failed, job.Keys[i])
		}
	}
	t.missQ.Add(failed...)
	return res
}

func (t *Tier) loadBlock(ctx context.Context, job *offload.Job, i int) error {
	k := job.Keys[i]
	if i >= len(job.Slots) {
		return fmt.Errorf("%s: load %s: job has %d slots for %d keys", t.label(), k, len(job.Slots), len(job.Keys))
	}
	if !k.Valid() {
		return fmt.Errorf("%s: load: %w", t.label(), offload.ErrInvalidKey)
	}
	slot, err := job.Arena.Slot(job.Slots[i])
	if err != nil {
		return fmt.Errorf("%s: load %s: %w", t.label(), k, err)
	}
	okey := objectKey(t.prefix, t.cfg.Layout, k)
	err = t.do(ctx, t.cfg.Retries, func(ctx context.Context) error {
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
	if t.events != nil {
		t.events.Add(offload.Event{Keys: []offload.Key{k}, Medium: offload.MediumStorage, Locality: t.locality, Removed: true, Tier: t.name})
	}
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
