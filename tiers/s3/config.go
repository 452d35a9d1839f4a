package s3

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/tiers/remote"
)

// Config configures an S3 tier. The yaml tags are the type-specific keys
// of a `type: s3` entry of `secondary_tiers`. Decode into DefaultConfig()
// so that absent keys keep their defaults; New also fills zero values of
// the sizing and timing fields with the defaults.
type Config struct {
	// Name is the tier name in its stack (the config entry's name).
	Name string `yaml:"-"`

	// Bucket is required. Prefix is prepended to every object key ("a/b"
	// and "a/b/" are the same); empty stores at the bucket root.
	Bucket string `yaml:"bucket"`
	Prefix string `yaml:"prefix"`
	// Endpoint is the base URL of the S3-compatible service
	// (http://host:port or https://…); empty uses AWS's regional endpoint.
	// Addressing is always path-style.
	Endpoint string `yaml:"endpoint"`
	// Region defaults to $AWS_REGION, then us-east-1.
	Region string `yaml:"region"`
	// AccessKey, SecretKey and SessionToken default to the standard
	// environment variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
	// AWS_SESSION_TOKEN; with neither, requests are anonymous.
	AccessKey    string `yaml:"access_key"`
	SecretKey    string `yaml:"secret_key"`
	SessionToken string `yaml:"session_token"`

	// IOThreads bounds concurrent PUT/GET requests across all jobs, and
	// separately the concurrent HEADs of existence checks (default 16).
	IOThreads int `yaml:"io_threads"`
	// CreateBucket creates a missing bucket at startup instead of failing.
	CreateBucket bool `yaml:"create_bucket"`
	// Shared: locality, max_inflight (default 256), timeout (one attempt
	// of one transfer request, body included, default 10s),
	// lookup_timeout (one existence check, a HEAD, default 2s; a step's
	// batch of checks gets four times as long), retries (after a
	// connection error, timeout, 5xx or 429; default 2), retry_backoff
	// (default 50ms), probe_interval (default 1s), unhealthy_after
	// (default 3), lookup_batch (default 1024), events (stored events,
	// and a removed event per corrupted object the tier deletes),
	// reconcile_interval (default 10m) and reconcile_rate (default 5000).
	remote.Shared `yaml:",inline"`

	// Namespace holds the FS layout's digest fields and rank (the same
	// `namespace` block as an fs entry; the daemon fills model_name from
	// its namespace). Object keys use the directory names an FS tier with
	// this namespace would use.
	Namespace filemapper.Namespace `yaml:"namespace"`
	// Layout overrides the names derived from Namespace when Base is set.
	Layout Layout `yaml:"-"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `yaml:"-"`
	// HTTPClient replaces the tier's HTTP client (tests).
	HTTPClient *http.Client `yaml:"-"`
}

// Defaults.
const (
	DefaultRegion        = "us-east-1"
	DefaultIOThreads     = 16
	DefaultMaxInflight   = remote.DefaultMaxInflight
	DefaultTimeout       = 10 * time.Second
	DefaultLookupTimeout = 2 * time.Second
	DefaultRetryBackoff  = 50 * time.Millisecond
)

// DefaultConfig returns a Config with every default filled in; decode the
// YAML keys over it.
func DefaultConfig() Config {
	return Config{
		IOThreads: DefaultIOThreads,
		Shared: remote.Shared{
			MaxInflight: DefaultMaxInflight, Timeout: DefaultTimeout, LookupTimeout: DefaultLookupTimeout,
			Retries: remote.DefaultRetries, RetryBackoff: DefaultRetryBackoff, ProbeInterval: remote.DefaultProbeInterval,
			UnhealthyAfter: remote.DefaultUnhealthyAfter, LookupBatch: remote.DefaultLookupBatch,
			ReconcileInterval: remote.DefaultReconcileInterval, ReconcileRate: remote.DefaultReconcileRate,
		},
	}
}

// withDefaults returns c with zero sizing and timing fields defaulted and
// the credentials and region taken from the environment when unset.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.IOThreads == 0 {
		c.IOThreads = d.IOThreads
	}
	c.Shared = c.Shared.WithDefaults(d.Shared)
	if c.Region == "" {
		c.Region = os.Getenv("AWS_REGION")
	}
	if c.Region == "" {
		c.Region = DefaultRegion
	}
	if c.AccessKey == "" && c.SecretKey == "" {
		c.AccessKey = os.Getenv("AWS_ACCESS_KEY_ID")
		c.SecretKey = os.Getenv("AWS_SECRET_ACCESS_KEY")
		if c.SessionToken == "" {
			c.SessionToken = os.Getenv("AWS_SESSION_TOKEN")
		}
	}
	return c
}

// Validate checks c as New would (zero sizing and timing fields take
// their defaults) without connecting; errors name the offending key.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(key string, format string, args ...any) error {
		return fmt.Errorf("s3 tier %q: %s: %s", c.Name, key, fmt.Sprintf(format, args...))
	}
	if c.Bucket == "" {
		return bad("bucket", "required")
	}
	if err := checkBucketName(c.Bucket); err != nil {
		return bad("bucket", "%q: %v", c.Bucket, err)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("endpoint", "%q is not an http:// or https:// URL", c.Endpoint)
		}
	}
	if _, err := remote.ParseLocality(c.Locality); err != nil {
		return bad("locality", "%v", err)
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		if c.AccessKey == "" {
			return bad("access_key", "required when secret_key is set")
		}
		return bad("secret_key", "required when access_key is set")
	}
	if strings.Contains(c.Prefix, "..") || strings.HasPrefix(c.Prefix, "/") {
		return bad("prefix", "%q must be relative and must not contain ..", c.Prefix)
	}
	if err := c.Shared.Check([]remote.Count{{Key: "io_threads", Value: c.IOThreads}}, nil); err != nil {
		return fmt.Errorf("s3 tier %q: %w", c.Name, err)
	}
	if err := c.Layout.validate(); err != nil {
		return bad("layout", "%v", err)
	}
	if c.Layout.Base == "" && c.Namespace.ModelName != "" {
		if _, err := LayoutOf(c.Namespace); err != nil {
			return bad("namespace", "%v", err)
		}
	}
	return nil
}

// checkBucketName applies the S3 bucket naming rules that matter for
// path-style URLs.
func checkBucketName(b string) error {
	if len(b) < 3 || len(b) > 63 {
		return fmt.Errorf("length %d, want 3..63", len(b))
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return fmt.Errorf("character %q not allowed (lowercase letters, digits, '-', '.')", c)
		}
	}
	return nil
}
