package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/region"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tierset"
	"github.com/kvtier/kvtier/tlsconfig"
)

// defaultServeConfig is what `kvtier serve` runs without --config: nothing
// outside this process is needed. The memfd arena lets engines on the same
// host map the primary's slots (GetArena); the FS tier keeps blocks across
// restarts.
const defaultServeConfig = `# kvtier serve: the embedded default configuration (kvtier serve
# --print-default-config). Every key below may be omitted; unknown keys and
# invalid values are start-up errors that name the key.

namespace:
  model: default            # names the model; storage tiers keep models apart
  bytes_per_block: 2MiB     # one offloaded block = one primary slot

primary:
  bytes: 1GiB               # capacity (--primary-bytes overrides it)
  policy: lru               # lru | arc
  arena:
    kind: memfd             # anonymous | file (with path: /dev/shm/...) | memfd
                            # file and memfd can be mapped by same-host engines

secondary_tiers:            # lookup order; each entry: name, type, type keys
  - name: local-disk
    type: fs
    root_dir: ./kvtier-data
    locality: local         # local (the default for fs) | remote; medium STORAGE
    max_bytes: 10GiB        # bound on block files (0 = unbounded: fills the disk)
    high_watermark: 0.95    # above 95% of max_bytes, evict least recently used
    low_watermark: 0.85     # ... down to 85%
    # fsync: none           # none | block | batch (durability: docs/configuration.md)

# default_load_tiers: []    # used when a request omits kv_load_tiers
# default_store_tiers: [{medium: storage}]
validation: lenient         # lenient (warn, skip, fail open) | strict (reject)

server:
  unix_socket: ./kvtier.sock      # created 0600; "" disables it
  tcp_addr: 127.0.0.1:7070        # "" disables it
  metrics_addr: 127.0.0.1:9464    # Prometheus /metrics; "" disables it
  # auth_token: secret            # required from TCP clients when set
  # auth_token_file: /etc/kvtier/token
  # auth_token_env: KVTIER_AUTH_TOKEN  # or an environment variable (a Kubernetes Secret)
  shutdown_timeout: 10s
  # request_idle_timeout: 10m     # release requests no call names for this long
  # max_connections: 1024         # per listener (lowered to fit the fd limit)
  # max_connections_per_peer: 256 # TCP API connections from one address (-1: no bound of its own)
  # connection_idle_timeout: 15m  # close connections without calls
  # keepalive_time: 30s           # ping quiet clients; close on no answer
  # keepalive_timeout: 10s
  # auth_timeout: 3s              # close TCP connections without a valid token by then
  # max_streams_per_connection: 128  # calls in flight per API connection
  # auto_step: 100ms              # end a step for an idle engine with tier work pending
  # engine_lookup_settle: 3ms     # a manager-mode step's answer waits this long for unsure lookups

# limits:                   # per API call; 0 = default
#   max_keys_per_call: 65536
#   max_key_bytes: 1024
#   max_message_bytes: 64MiB
#   max_receive_bytes: 1GiB           # requests being received at once, all connections
#   receive_timeout: 30s              # from a call's reservation to its whole request
#   max_requests: 65536
#   max_session_requests: 16384       # per client connection (max_requests / 4)
#   max_tenant_requests: 16384        # per tenant, all its connections (max_requests / 4)
#   stream_request_timeout: 30s       # a block-stream get or put, whole: this ...
#   stream_min_rate: 4MiB             # ... plus its bytes at this rate per second
#   max_params_bytes: 64KiB
#   max_wait: 10s
#   max_session_params_bytes: 64MiB   # kv_transfer_params held per session
#   max_params_bytes_total: 256MiB    # ... and by all requests

events:
  enabled: false            # vLLM KV events over ZMQ
  # endpoint: tcp://127.0.0.1:5557  # loopback; tcp://*:5557 (vLLM's default) for routers elsewhere
  # mode: bind              # bind | connect; default: bind if the endpoint has
                            # "*" or "::" or is ipc://, else connect (vLLM's rule)
  # replay_endpoint: tcp://127.0.0.1:5558  # none by default
  # self_describing: false
  # medium_names:           # wire names of the media, for routers with
  #   cpu: CPU              # another vocabulary (keys cpu, storage)
  #   storage: STORAGE

# cascades:                 # primary -> secondary tiers, in every namespace
#   pin_budget: 0.25        # share of the primary cascades in flight may pin; "off"
#   tier_share: 0.5         # share of that budget one tier may pin (1 with one tier)
#   max_deferred_blocks: 0  # blocks of cascades waiting for that budget (0: the primary's slots; -1: drop at once)
#   back_pressure:          # drop cascades to a tier while its cascades are slow
#     enabled: true
#     alpha: 0.3            # EMA weight of a new latency sample
#     high: 1s              # on above this EMA ...
#     low: 500ms            # ... off again below this one
#     warmup: 3             # first samples ignored (-1: none)

# prefetch:                 # routers' and agents' prefetches (kvtier prefetch)
#   share: 0.25             # share of the primary their promotions may hold in flight; "off"
#   max_queued: 1024        # prefetches waiting for tiers at once

# pins:                     # routers' and agents' pins with a TTL (kvtier pin)
#   share: 0.25             # share of an owner's quota (the primary without tenants) pins may hold; "off"

# engines:                  # vLLM manager mode (needs server.unix_socket)
#   enabled: true
#   primary_bytes: 1GiB     # each engine layout's primary (default primary.bytes)
#   max_namespaces: 4

# regions:                  # vLLM tier mode
#   max_regions: 64
#   max_requests: 65536     # per region
#   lookup_wait: 2s         # then keys tiers have not settled answer "unknown"
#   tick: 1ms               # executor poll interval while work is pending

# tenants:                  # customers sharing the daemon (docs/tenants.md)
#   - name: acme            # its key space, metrics label and stats row
#     token_file: /etc/kvtier/acme.token  # or token: ...; TCP and Unix socket
#     namespaces: [default] # what its token reaches; others: PERMISSION_DENIED
#     quota:                # guaranteed: no other tenant's store evicts it
#       primary: 256MiB
#       tiers: {local-disk: 5GiB}  # fs, redis, s3 tiers with max_bytes; memory with capacity_blocks
#     weight: 1             # share of the space no quota claims
#     event_salt: ""        # its KV events' salt (default kvtier_tenant:<name>)
# shared_spaces:            # blocks several tenants share, e.g. system prompts
#   - name: prompts         # reached as namespace "prompts"
#     tenants: [acme]
#     quota: {primary: 64MiB}
`

type serveFlags struct {
	printDefault bool
	checkConfig  bool
	config       string
	primaryBytes string
	logLevel     string
	logJSON      bool
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve [--config FILE]",
		Short: "Run the kvtier daemon (gRPC API over a Unix socket and TCP, metrics)",
		Long: `serve runs the daemon: a CPU primary tier in front of the configured secondary
tiers, the gRPC API (api/kvtier/v1) on a Unix socket (0600) and a TCP address,
the arena side channel next to the Unix socket, and Prometheus metrics.

Without --config it runs an embedded default that needs no outside service:
a 1GiB primary (--primary-bytes) on a memfd arena with 2MiB blocks, an FS tier
under ./kvtier-data (local, at most 10GiB: least recently used blocks are
evicted above 95% down to 85%), events off, the API on ./kvtier.sock and
127.0.0.1:7070, metrics on http://127.0.0.1:9464/metrics.

SIGINT, SIGTERM or SIGHUP stops accepting calls, drains in-flight transfers
within server.shutdown_timeout, flushes events, removes the sockets and exits
0 (the configuration is read at start only; restart to change it).

A second daemon on the same socket, file arena or fs tier directory refuses
to start before it touches any of the first one's files.`,
		Example: `  kvtier serve
  kvtier serve --primary-bytes 8GiB
  kvtier serve --print-default-config > kvtier.yaml
  kvtier serve --config kvtier.yaml
  kvtier serve --config kvtier.yaml --check-config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.printDefault {
				_, err := fmt.Fprint(cmd.OutOrStdout(), defaultServeConfig)
				return err
			}
			if f.checkConfig {
				return checkServeConfig(f, cmd.OutOrStdout())
			}
			// SIGHUP (the terminal went away, or an init system's
			// reload) stops the daemon like SIGTERM: configuration is
			// read only at start.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			return serve(ctx, f, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&f.config, "config", "", "config file (YAML); default: the embedded default")
	cmd.Flags().BoolVar(&f.printDefault, "print-default-config", false, "print the embedded default config (commented) and exit")
	cmd.Flags().BoolVar(&f.checkConfig, "check-config", false, "validate the config as a start would (every key, every tier's settings), touching no file, socket or server, and exit: 0 when it is valid, 2 when not (the key named)")
	cmd.Flags().StringVar(&f.primaryBytes, "primary-bytes", "", "primary tier capacity, e.g. 1GiB (overrides primary.bytes)")
	cmd.Flags().StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().BoolVar(&f.logJSON, "log-json", false, "log JSON lines instead of text")
	return cmd
}

func newLogger(f serveFlags, w interface{ Write([]byte) (int, error) }) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	if f.logJSON {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// loadServeConfig reads --config or the embedded default and applies the
// flags that override it.
func loadServeConfig(f serveFlags) (*config.Config, error) {
	var cfg *config.Config
	var err error
	if f.config != "" {
		cfg, err = config.Load(f.config)
	} else {
		cfg, err = config.Parse([]byte(defaultServeConfig))
	}
	if err != nil {
		return nil, err
	}
	if f.primaryBytes != "" {
		b, err := confvalue.ParseByteSize(f.primaryBytes)
		if err != nil {
			return nil, fmt.Errorf("--primary-bytes: %w", err)
		}
		if b < cfg.Namespace.BytesPerBlock {
			return nil, fmt.Errorf("--primary-bytes %s holds no block of %s", b, cfg.Namespace.BytesPerBlock)
		}
		cfg.Primary.Bytes = b
	}
	if err := checkListenAddrs(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// checkServeConfig validates the configuration serve would start with
// (--check-config): it parses and checks every key and plans every tier
// as a start does, but opens, binds and dials nothing. An invalid one is
// exit code 2 with the error, which names the key.
func checkServeConfig(f serveFlags, stdout interface{ Write([]byte) (int, error) }) error {
	invalid := func(err error) error {
		return &exitError{code: 2, msg: "kvtier: invalid configuration: " + err.Error()}
	}
	cfg, err := loadServeConfig(f)
	if err != nil {
		return invalid(err)
	}
	if err := checkSocketPath(cfg.Server.UnixSocket); err != nil {
		return invalid(err)
	}
	decls, err := tierset.Declare(cfg)
	if err != nil {
		return invalid(err)
	}
	src := f.config
	if src == "" {
		src = "the embedded default"
	}
	fmt.Fprintf(stdout, "%s: valid: primary %s, %d secondary tier(s)", src, cfg.Primary.Bytes, len(decls))
	for _, d := range decls {
		fmt.Fprintf(stdout, "; %s", d)
	}
	fmt.Fprintln(stdout)
	return nil
}

// checkSocketPath rejects a Unix socket path bind(2) cannot take, with
// room for the arena side socket's suffix.
func checkSocketPath(p string) error {
	if len(p) > maxSocketPath-4 {
		return fmt.Errorf("server.unix_socket: %q is %d bytes long; Unix socket paths are limited to %d bytes (the arena side socket adds \".arena\"): use a shorter path", p, len(p), maxSocketPath-6)
	}
	return nil
}

// maxSocketPath is the longest Unix socket path bind(2) takes.
const maxSocketPath = 107

// claimDaemon takes the daemon's lock (server.unix_socket + ".lock") and
// checks that the TCP ports are free, naming the key of whatever is in
// use.
func claimDaemon(cfg *config.Config) (*dirlock.Lock, error) {
	var lock *dirlock.Lock
	if p := cfg.Server.UnixSocket; p != "" {
		if err := checkSocketPath(p); err != nil {
			return nil, err
		}
		l, err := dirlock.AcquireFile(p+".lock", "kvtier daemon")
		if err != nil {
			if errors.Is(err, dirlock.ErrLocked) {
				return nil, fmt.Errorf("server.unix_socket %s: another kvtier daemon serves it (%v); stop it, or give this one another socket", p, err)
			}
			return nil, fmt.Errorf("server.unix_socket %s: %w", p, err)
		}
		lock = l
	}
	for _, a := range []struct{ key, addr string }{
		{"server.tcp_addr", cfg.Server.TCPAddr},
		{"server.metrics_addr", cfg.Server.MetricsAddr},
	} {
		if a.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", a.addr)
		if err != nil {
			lock.ReleaseAndRemove()
			return nil, fmt.Errorf("%s %s: %w", a.key, a.addr, err)
		}
		ln.Close()
	}
	return lock, nil
}

// checkListenAddrs rejects an unusable TCP address before any tier is
// built, naming its key: a listen error later would not say which key
// holds the bad value.
func checkListenAddrs(cfg *config.Config) error {
	for _, a := range []struct{ key, addr string }{
		{"server.tcp_addr", cfg.Server.TCPAddr},
		{"server.metrics_addr", cfg.Server.MetricsAddr},
	} {
		if a.addr == "" {
			continue
		}
		_, port, err := net.SplitHostPort(a.addr)
		// A named port ("http") is left to the resolver.
		if _, nerr := strconv.ParseUint(port, 10, 64); err == nil && nerr == nil {
			if _, perr := strconv.ParseUint(port, 10, 16); perr != nil {
				err = fmt.Errorf("port %s: want 0..65535", port)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: invalid value %q: %w (want host:port, e.g. 127.0.0.1:7070)", a.key, a.addr, err)
		}
	}
	return nil
}

func serve(ctx context.Context, f serveFlags, stderr interface{ Write([]byte) (int, error) }) error {
	log, err := newLogger(f, stderr)
	if err != nil {
		return err
	}
	cfg, err := loadServeConfig(f)
	if err != nil {
		return err
	}
	// Claim the socket and the ports before building anything: a second
	// daemon with this config must fail before it opens the arena or the
	// tiers of the one that runs.
	lock, err := claimDaemon(cfg)
	if err != nil {
		return err
	}
	// The lock file goes with the socket, on a failed start as on a
	// clean stop (a crash leaves it, unlocked: the next start takes it).
	defer lock.ReleaseAndRemove()
	srv, err := buildDaemon(ctx, cfg, log)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return errors.Join(err, srv.Shutdown(ctx))
	}
	<-ctx.Done()
	log.Info("shutting down", "timeout", time.Duration(cfg.Server.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.Server.ShutdownTimeout))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Error("shutdown", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}

// buildDaemon builds the primary, the tiers, the manager and the server,
// and logs one line per tier.
// streamAddr is the block stream's listen address: server.stream_addr, or
// the TCP API's host on a free port (peers learn it from Stats); none with
// "off" or without a TCP API.
func streamAddr(configured, tcpAddr string) string {
	switch {
	case configured == "off":
		return ""
	case configured != "":
		return configured
	case tcpAddr == "":
		return ""
	}
	host, _, err := net.SplitHostPort(tcpAddr)
	if err != nil {
		return ""
	}
	return net.JoinHostPort(host, "0")
}

func buildDaemon(ctx context.Context, cfg *config.Config, log *slog.Logger) (*server.Server, error) {
	token := cfg.Server.AuthToken
	switch {
	case cfg.Server.AuthTokenFile != "":
		var err error
		if token, err = readSecretToken(cfg.Server.AuthTokenFile); err != nil {
			return nil, fmt.Errorf("server.auth_token_file: %w", err)
		}
	case cfg.Server.AuthTokenEnv != "":
		var err error
		if token, err = config.TokenFromEnv(cfg.Server.AuthTokenEnv); err != nil {
			return nil, fmt.Errorf("server.auth_token_env: %w", err)
		}
	}
	tenants, shared, err := tenantsOf(cfg)
	if err != nil {
		return nil, err
	}
	if token == "" && cfg.Server.TCPAddr != "" && !loopback(cfg.Server.TCPAddr) {
		log.Warn("the TCP API listens beyond loopback without server.auth_token", "tcp_addr", cfg.Server.TCPAddr)
	}
	var serverTLS *tls.Config
	if t := cfg.Server.TLS; t != (config.TLS{}) {
		var err error
		if serverTLS, err = tlsconfig.Server(t.CertFile, t.KeyFile, t.ClientCAFile); err != nil {
			return nil, fmt.Errorf("server.%w", err)
		}
	}
	var namespaces []server.NamespaceConfig
	var closeManager func()
	if cfg.HasPrimary() {
		nc, closeFn, err := buildManagerNamespace(ctx, cfg, log)
		if err != nil {
			return nil, err
		}
		namespaces, closeManager = []server.NamespaceConfig{nc}, closeFn
	} else {
		log.Info("no primary tier (primary.bytes: 0): serving vLLM tier mode only")
		closeManager = func() {}
	}
	regions, err := buildRegions(cfg, log)
	if err != nil {
		closeManager()
		return nil, err
	}
	engines, maxEngines := buildEngines(cfg, log)
	srv, err := server.New(server.Config{
		Namespaces:    namespaces,
		Regions:       regions,
		Engines:       engines,
		MaxNamespaces: len(namespaces) + maxEngines,
		UnixSocket:    cfg.Server.UnixSocket,
		TCPAddr:       cfg.Server.TCPAddr,
		AuthToken:     token,
		UnixPeers:     cfg.Server.UnixPeerMap(),
		Tenants:       tenants,
		SharedSpaces:  shared,
		TLS:           serverTLS,
		StreamAddr:    streamAddr(cfg.Server.StreamAddr, cfg.Server.TCPAddr),
		MetricsAddr:   cfg.Server.MetricsAddr,
		Limits: server.Limits{
			MaxKeysPerCall:     cfg.Limits.MaxKeysPerCall,
			MaxKeyBytes:        cfg.Limits.MaxKeyBytes,
			MaxMessageBytes:    int(cfg.Limits.MaxMessageBytes),
			MaxReceiveBytes:    int64(cfg.Limits.MaxReceiveBytes),
			ReceiveTimeout:     time.Duration(cfg.Limits.ReceiveTimeout),
			MaxRequests:        cfg.Limits.MaxRequests,
			MaxSessionRequests: cfg.Limits.MaxSessionRequests,
			MaxTenantRequests:  cfg.Limits.MaxTenantRequests,

			StreamRequestTimeout: time.Duration(cfg.Limits.StreamRequestTimeout),
			StreamMinRate:        int64(cfg.Limits.StreamMinRate),
			MaxParamsBytes:       int(cfg.Limits.MaxParamsBytes),
			MaxWait:              time.Duration(cfg.Limits.MaxWait),

			MaxSessionParamsBytes: int64(cfg.Limits.MaxSessionParamsBytes),
			MaxParamsBytesTotal:   int64(cfg.Limits.MaxParamsBytesTotal),
			RequestIdleTimeout:    time.Duration(cfg.Server.RequestIdleTimeout),
			AutoStepInterval:      time.Duration(cfg.Server.AutoStep),
			EngineLookupSettle:    time.Duration(cfg.Server.EngineLookupSettle),
			MaxConnections:        cfg.Server.MaxConnections,
			MaxConnectionsPerPeer: cfg.Server.MaxConnectionsPerPeer,
			ConnectionIdleTimeout: time.Duration(cfg.Server.ConnectionIdleTimeout),
			KeepaliveTime:         time.Duration(cfg.Server.KeepaliveTime),
			KeepaliveTimeout:      time.Duration(cfg.Server.KeepaliveTimeout),
			AuthTimeout:           time.Duration(cfg.Server.AuthTimeout),

			MaxStreamsPerConnection: cfg.Server.MaxStreamsPerConnection,
		},
		Logger: log,
	})
	if err != nil {
		closeManager()
		if regions != nil {
			regions.Close(ctx)
		}
		return nil, err
	}
	return srv, nil
}

// buildManagerNamespace builds the primary, its tiers and the manager
// over them (with the event publisher when events are on), and returns a
// function that closes them for a start that fails later.
func buildManagerNamespace(ctx context.Context, cfg *config.Config, log *slog.Logger) (server.NamespaceConfig, func(), error) {
	// The event publisher binds its endpoints first: a bad or busy
	// endpoint must fail the start before any tier creates a directory,
	// config.json or lock on disk.
	var pub *events.Publisher
	own := map[uint64]*events.Publisher{} // tenants' own publishers, by key space
	closePub := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, q := range own {
			q.Close(cctx)
		}
		if pub != nil {
			pub.Close(cctx)
		}
	}
	if cfg.Events.Enabled {
		ev := cfg.Events
		newPub := func(endpoint, replay, topic, who string) (*events.Publisher, error) {
			return events.New(events.Config{
				Endpoint:       endpoint,
				ReplayEndpoint: replay,
				Topic:          topic,
				Model:          cfg.Namespace.Model,
				DPRank:         ev.DPRank,
				BufferSteps:    ev.BufferSteps,
				HWM:            ev.HWM,
				MaxQueueSize:   ev.MaxQueueSize,
				MaxConns:       server.FitConnections(cmp.Or(cfg.Server.MaxConnections, server.DefaultMaxConnections), log),
				Format:         events.Format{Positional: ev.Positional, RawHashes: ev.RawHashes},
				Mode:           string(ev.Mode),
				Tracker:        events.TrackerConfig{SelfDescribing: ev.SelfDescribing, MediumNames: wireMediumNames(ev.MediumNames), Spaces: spaceSalts(cfg)},
				Logger:         log.With("component", "events", "for", who),
			})
		}
		var err error
		if pub, err = newPub(ev.Endpoint, ev.ReplayEndpoint, ev.Topic, "all"); err != nil {
			return server.NamespaceConfig{}, nil, fmt.Errorf("events: %w", err)
		}
		for i, t := range cfg.Tenants {
			if t.Events.Endpoint == "" {
				continue
			}
			sp, err := keyspace.Tenant(t.Name)
			if err == nil {
				own[sp.ID()], err = newPub(t.Events.Endpoint, t.Events.ReplayEndpoint, t.Events.Topic, t.Name)
			}
			if err != nil {
				closePub()
				return server.NamespaceConfig{}, nil, fmt.Errorf("tenants[%d].events: %w", i, err)
			}
			log.Info("publishing a tenant's KV events on its own", "tenant", t.Name, "endpoint", t.Events.Endpoint, "bound", own[sp.ID()].Addr(), "topic", own[sp.ID()].Topic())
		}
	}
	fail := func(err error) (server.NamespaceConfig, func(), error) {
		closePub()
		return server.NamespaceConfig{}, nil, err
	}
	slotSize, _ := cfg.Namespace.BytesPerBlock.Int()
	shares, err := primaryShares(cfg)
	if err != nil {
		return fail(err)
	}
	p, err := cpu.New(cpu.Config{
		SlotSize: slotSize,
		Capacity: int64(cfg.Primary.Bytes),
		Policy:   string(cfg.Primary.Policy),
		Arena:    cpu.ArenaConfig{Kind: cpu.ArenaKind(cfg.Primary.Arena.Kind), Path: cfg.Primary.Arena.Path},
		Events:   cfg.Events.Enabled,
		Shares:   shares,
	})
	if err != nil {
		return fail(fmt.Errorf("primary: %w", err))
	}
	tiers, err := tierset.Build(ctx, cfg, tierset.Options{Logger: log})
	if err != nil {
		p.Close()
		return fail(err)
	}
	budget, admission := cascadeConfig(cfg)
	m, err := tiering.New(tiering.Config{Primary: p, Tiers: tiers, Budget: budget, Admission: admission, Prefetch: prefetchConfig(cfg), Pins: pinConfig(cfg), Logger: log})
	if err != nil {
		for _, t := range tiers {
			t.Close(ctx)
		}
		p.Close()
		return fail(err)
	}
	closeFn := func() {
		m.Close(ctx)
		closePub()
	}
	st := p.Stats()
	log.Info("tier", "name", "primary", "type", "cpu", "medium", "CPU", "locality", "-",
		"capacity", fmt.Sprintf("%s (%d slots of %s)", cfg.Primary.Bytes, st.NumSlots, cfg.Namespace.BytesPerBlock),
		"policy", cfg.Primary.Policy, "arena", cfg.Primary.Arena.Kind)
	for _, t := range tiers {
		d := explain.DeclarationOf(t)
		log.Info("tier", "name", d.Name, "type", d.Type, "medium", d.MediumString(), "locality", d.LocalityString(), "capacity", capacityOf(t))
	}
	nc := server.ManagerNamespace("", m, p, *cfg.Parser())
	if pub != nil {
		ev := cfg.Events
		nc = server.WithPublishers(nc, pub, own)
		log.Info("publishing KV events", "endpoint", ev.Endpoint, "bound", pub.Addr(), "replay", pub.ReplayAddr(), "topic", pub.Topic(), "self_describing", ev.SelfDescribing)
	}
	return nc, closeFn, nil
}

// buildEngines returns the factory of vLLM manager-mode namespaces: each
// engine layout gets a primary of engines.primary_bytes on a memfd arena
// (the engines map it) with rows of the layout's size, the configured
// secondary tiers laid out for it, and events on (returned to the engines
// to publish). Nil when engines may not attach.
func buildEngines(cfg *config.Config, log *slog.Logger) (server.EngineFactory, int) {
	if !cfg.Engines.On() || cfg.Server.UnixSocket == "" {
		return nil, 0
	}
	capacity := int64(cmp.Or(cfg.Engines.PrimaryBytes, cfg.Primary.Bytes, confvalue.GiB))
	parser := *cfg.Parser()
	log = log.With("component", "engines")
	return func(ctx context.Context, name string, l region.Layout) (server.NamespaceConfig, error) {
		if capacity < int64(l.RowStride) {
			return server.NamespaceConfig{}, fmt.Errorf("engines.primary_bytes %s holds no %d-byte row", confvalue.ByteSize(capacity), l.RowStride)
		}
		p, err := cpu.New(cpu.Config{
			SlotSize: l.RowStride, Capacity: capacity, Policy: string(cfg.Primary.Policy),
			Arena: cpu.ArenaConfig{Kind: cpu.ArenaMemfd}, Events: true,
		})
		if err != nil {
			return server.NamespaceConfig{}, fmt.Errorf("primary: %w", err)
		}
		c := *cfg
		c.Namespace.Model = name
		c.Namespace.BytesPerBlock = confvalue.ByteSize(l.RowStride)
		c.Events.Enabled = true
		tiers, err := tierset.Build(ctx, &c, tierset.Options{Logger: log.With("namespace", name)})
		if err != nil {
			p.Close()
			return server.NamespaceConfig{}, err
		}
		budget, admission := cascadeConfig(cfg)
		m, err := tiering.New(tiering.Config{Primary: p, Tiers: tiers, Budget: budget, Admission: admission, Prefetch: prefetchConfig(cfg), Pins: pinConfig(cfg), Logger: log.With("namespace", name)})
		if err != nil {
			for _, t := range tiers {
				t.Close(ctx)
			}
			p.Close()
			return server.NamespaceConfig{}, err
		}
		log.Info("engine namespace", "namespace", name, "slots", p.NumSlots(), "slot_size", l.RowStride, "tiers", len(tiers))
		return server.ManagerNamespace(name, m, p, parser), nil
	}, cmp.Or(cfg.Engines.MaxNamespaces, 4)
}

// buildRegions builds the vLLM tier-mode service: every engine layout
// gets the configured secondary tiers, laid out for it (the namespace
// names their directories, prefixes and keys), with events on for the
// engine to publish. It needs the Unix socket (regions come as file
// descriptors); without one there is none.
func buildRegions(cfg *config.Config, log *slog.Logger) (*region.Service, error) {
	if cfg.Server.UnixSocket == "" {
		return nil, nil
	}
	parser := cfg.Parser()
	log = log.With("component", "region")
	return region.New(region.Config{
		Tiers: func(ctx context.Context, ns string, l region.Layout) ([]offload.SecondaryTier, error) {
			c := *cfg
			c.Namespace.Model = ns
			c.Namespace.BytesPerBlock = confvalue.ByteSize(l.RowStride)
			c.Events.Enabled = true
			return tierset.Build(ctx, &c, tierset.Options{Logger: log.With("namespace", ns)})
		},
		Parse: func(id string, params []byte) (*offload.ReqContext, error) {
			if len(params) == 0 {
				return parser.NewReqContext(id, nil)
			}
			return parser.NewReqContext(id, params)
		},
		Logger:      log,
		Admission:   admissionConfig(cfg),
		MaxRegions:  cfg.Regions.MaxRegions,
		MaxRequests: cfg.Regions.MaxRequests,
		LookupWait:  time.Duration(cfg.Regions.LookupWait),
		Tick:        time.Duration(cfg.Regions.Tick),
	})
}

// prefetchConfig returns the bounds of prefetches (config.Prefetch,
// checked when the config was read).
func prefetchConfig(cfg *config.Config) tiering.PrefetchConfig {
	share, _ := cfg.Prefetch.ShareValue()
	return tiering.PrefetchConfig{Share: share, MaxQueued: cfg.Prefetch.MaxQueued}
}

// pinConfig returns the bounds of routers' pins (config.Pins, checked
// when the config was read).
func pinConfig(cfg *config.Config) tiering.PinConfig {
	share, _ := cfg.Pins.ShareValue()
	return tiering.PinConfig{Share: share}
}

// cascadeConfig returns the cascade pin budget and back-pressure of every
// namespace's stack (config.Cascades; validated when it was parsed).
func cascadeConfig(cfg *config.Config) (tiering.BudgetConfig, tiering.AdmissionConfig) {
	share, _ := cfg.Cascades.PinBudgetShare()
	b := tiering.BudgetConfig{Disabled: share < 0, TierFraction: cfg.Cascades.TierShare, MaxDeferred: cfg.Cascades.MaxDeferredBlocks}
	if share > 0 {
		b.Fraction = share
	}
	return b, admissionConfig(cfg)
}

func admissionConfig(cfg *config.Config) tiering.AdmissionConfig {
	bp := cfg.Cascades.BackPressure
	return tiering.AdmissionConfig{
		Disabled: bp.Enabled != nil && !*bp.Enabled,
		Alpha:    bp.Alpha,
		High:     time.Duration(bp.High),
		Low:      time.Duration(bp.Low),
		Warmup:   bp.Warmup,
	}
}

// wireMediumNames keys the configured names by canonical medium, as the
// events tracker wants them; nil when none is renamed.
func wireMediumNames(n config.MediumNames) map[string]string {
	var m map[string]string
	for canon, name := range map[string]string{events.MediumCPU: n.CPU, events.MediumStorage: n.Storage} {
		if name == "" {
			continue
		}
		if m == nil {
			m = make(map[string]string, 2)
		}
		m[canon] = name
	}
	return m
}

func loopback(addr string) bool {
	host, _, _ := strings.Cut(addr, ":")
	if strings.HasPrefix(addr, "[") {
		host = strings.TrimPrefix(strings.SplitN(addr, "]", 2)[0], "[")
	}
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1"
}

// capacityDescriber is implemented by tiers that can say, for the
// start-up log, how much they hold and may hold (fs, memory).
type capacityDescriber interface {
	DescribeCapacity() string
}

// capacityOf describes a tier's capacity for the start-up log.
func capacityOf(t offload.SecondaryTier) string {
	if c, ok := t.(capacityDescriber); ok {
		return c.DescribeCapacity()
	}
	return "n/a"
}
