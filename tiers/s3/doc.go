// Package s3 is kvtier's S3-compatible object-store secondary tier
// (`type: s3`, docs/semantics.md §5.2, docs/design.md §5): medium STORAGE, locality from
// config (usually remote). It works with any service speaking the S3 API
// with path-style addressing (AWS S3, versitygw, MinIO, Ceph RGW, …).
//
// # Configuration
//
//	secondary_tiers:
//	  - name: objects
//	    type: s3
//	    bucket: kv-cache            # required
//	    prefix: cluster-a           # optional key prefix
//	    endpoint: http://10.0.0.5:7070
//	    region: us-east-1           # default $AWS_REGION, then us-east-1
//	    access_key: …               # default $AWS_ACCESS_KEY_ID …
//	    secret_key: …               # … and $AWS_SECRET_ACCESS_KEY
//	    locality: remote
//	    io_threads: 16              # concurrent PUT/GET (and, separately, HEAD)
//	    max_inflight: 256           # jobs in flight; more fail at once
//	    timeout: 10s                # per transfer attempt, body included
//	    lookup_timeout: 2s          # per existence check (HEAD)
//	    retries: 2                  # after transient failures
//	    retry_backoff: 50ms         # exponential, with jitter
//	    create_bucket: false        # missing bucket: error unless true
//	    probe_interval: 1s          # health probe while down
//	    unhealthy_after: 3          # consecutive transport failures
//	    events: false               # stored/removed events
//	    max_bytes: 10TiB            # optional: kvtier's own bound (remote.Budget)
//
// With max_bytes the tier lists its layout's objects at startup and,
// before a store that would pass the bound, deletes the least recently
// stored or loaded objects (tenants' quota.tiers divide the bound). An
// object store keeps no recency, so the order is the tier's own since
// startup; listed objects start as the oldest.
//
// Invalid values are errors naming the key. Startup checks the bucket
// with HEAD: an endpoint that does not answer (ErrUnreachable) or a
// missing bucket (ErrBucketNotFound, unless create_bucket) fails New.
//
// # Object layout and format
//
// Object keys follow the FS tier's layout under the prefix (Layout), so
// one naming scheme serves both tiers:
// <prefix>/<model>_<digest>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin.
// Each object is a 32-byte kvtier envelope (package tiers/remote: magic,
// length, XXH3-64 of the payload and of the key) followed by the block.
//
// # Behaviour
//
//   - Lookup is asynchronous (package asynclookup): the first lookup of a
//     key answers Retry; at the tier's OnScheduleEnd the step's keys are
//     checked with concurrent HEADs and later lookups answer Hit or Miss.
//   - Stores skip objects that already exist (HEAD), then PUT; loads GET
//     the object straight into the slot and verify length and checksum
//     before the job reports success. A corrupt object is a Miss for the
//     request, is deleted, and is counted (Stats.Corrupted, Deleted). A
//     failed load marks its keys Miss for the request so the manager does
//     not re-promote them in a loop; a partially failed load reports the
//     loaded prefix.
//   - Each request attempt has a timeout; transient failures (connection
//     errors, timeouts, 5xx, 429) are retried with exponential backoff.
//     After unhealthy_after consecutive transport failures the tier is
//     unhealthy: lookups answer Miss at once, stores (cascades) and loads
//     fail at once and are counted as skipped, and a background probe
//     (HEAD bucket) marks it healthy again when the service answers. No
//     tier method waits for the network.
//   - Events (when enabled): one stored event (medium STORAGE, the tier's
//     locality) per fully successful store job, one removed event per
//     corrupted object deleted.
//
// # Capacity
//
// The tier does not limit or evict: capacity is the bucket's lifecycle
// policy. Configure an expiration rule on the prefix, for example
//
//	{"Rules":[{"ID":"kv-cache","Status":"Enabled",
//	  "Filter":{"Prefix":"cluster-a/"},"Expiration":{"Days":1}}]}
//
// (`aws s3api put-bucket-lifecycle-configuration`, or the equivalent of
// the service in use). S3 does not tell the tier about objects its rules
// expire or other clients delete, so with events on the tier reconciles:
// it remembers the keys it announced stored (bounded; beyond the bound the
// oldest are published as removed) and every reconcile_interval (default
// 10m) and after every outage HEADs them, at most reconcile_rate per
// second (default 5000), publishing the removal of each vanished object.
// A router's view of this tier is thus stale for at most about one
// interval. Keep the lifecycle generous relative to cache reuse and prefer
// one prefix per model namespace so rules can differ.
package s3
