package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"go.yaml.in/yaml/v3"
)

// Server configures the daemon's listeners (kvtier serve).
type Server struct {
	// UnixSocket is the API's Unix socket, created 0600 (default
	// ./kvtier.sock; "" disables it). The arena side channel listens on
	// the same path with ".arena" appended.
	UnixSocket string `yaml:"unix_socket"`
	// TCPAddr is the API's TCP address (default 127.0.0.1:7070; ""
	// disables it). Keep it on loopback unless AuthToken is set.
	TCPAddr string `yaml:"tcp_addr"`
	// MetricsAddr serves Prometheus /metrics (default 127.0.0.1:9464; ""
	// disables it).
	MetricsAddr string `yaml:"metrics_addr"`
	// AuthToken, if set, is required from TCP clients as "authorization:
	// Bearer <token>". AuthTokenFile reads it from a file instead (first
	// line, surrounding whitespace trimmed); set at most one.
	AuthToken     string `yaml:"auth_token"`
	AuthTokenFile string `yaml:"auth_token_file"`
	// AuthTokenEnv names the environment variable holding it (a
	// Kubernetes Secret passed as an env var).
	AuthTokenEnv string `yaml:"auth_token_env"`
	// UnixPeers: with tokens configured (auth_token or tenants), a call on
	// the Unix socket needs a token too, unless its process's user id
	// (as the kernel reports it) is listed here, as the admin or as a
	// tenant. Without tokens every caller on the socket is the admin.
	UnixPeers []UnixPeer `yaml:"unix_peers"`
	// ShutdownTimeout bounds the drain at SIGINT/SIGTERM (default 10s).
	ShutdownTimeout confvalue.Duration `yaml:"shutdown_timeout"`
	// RequestIdleTimeout releases a request (its pins and reservations)
	// that no call has named for this long (default 10m).
	RequestIdleTimeout confvalue.Duration `yaml:"request_idle_timeout"`
	// MaxConnections bounds each listener's connections (default 1024,
	// lowered to fit the file descriptor limit).
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerPeer bounds the TCP API's connections from one
	// address (default: a quarter of max_connections; -1: none but
	// max_connections). A host at its share makes room among its own
	// connections that have not authenticated, else its new connection is
	// refused.
	MaxConnectionsPerPeer int `yaml:"max_connections_per_peer"`
	// ConnectionIdleTimeout closes a connection without calls (default
	// 15m); the requests of its session are released.
	ConnectionIdleTimeout confvalue.Duration `yaml:"connection_idle_timeout"`
	// KeepaliveTime and KeepaliveTimeout: a quiet connection is pinged
	// every KeepaliveTime (default 30s) and closed when a ping goes
	// unanswered for KeepaliveTimeout (default 10s).
	KeepaliveTime    confvalue.Duration `yaml:"keepalive_time"`
	KeepaliveTimeout confvalue.Duration `yaml:"keepalive_timeout"`
	// AuthTimeout: a TCP API connection that has carried no call with a
	// valid token for this long is closed, and a block-stream connection
	// must send its hello within it (default 3s; negative: API connections
	// are never closed for it).
	AuthTimeout confvalue.Duration `yaml:"auth_timeout"`
	// MaxStreamsPerConnection bounds the calls in flight on one API
	// connection (default 128); further calls wait in the client.
	MaxStreamsPerConnection int `yaml:"max_streams_per_connection"`
	// AutoStep: when no engine has ended a step for this long and tier
	// work is pending, the daemon ends one (default 100ms; negative: never).
	AutoStep confvalue.Duration `yaml:"auto_step"`
	// EngineLookupSettle: how long a manager-mode engine step's answer may
	// wait for the lookups it left unsure (an fs tier's existence check, a
	// promotion from a tier) to settle, so that the engine learns the
	// verdict one step sooner (default 3ms; negative: never wait). The
	// engine does not wait for the answer; keep it under its step time.
	EngineLookupSettle confvalue.Duration `yaml:"engine_lookup_settle"`
	// StreamAddr is the block stream's address, where peer daemons read
	// primary blocks without the API's copies (default: the TCP API's host
	// on a free port, which peers learn from Stats; "off" disables it).
	// Set a fixed port where a firewall needs one.
	StreamAddr string `yaml:"stream_addr"`
	// TLS, with cert_file and key_file, serves the TCP API over TLS;
	// client_ca_file then requires client certificates from that CA
	// (mutual TLS, e.g. between peer daemons). The Unix socket is not
	// affected; the auth token still applies.
	TLS TLS `yaml:"tls"`
}

// UnixPeer names who a token-less caller on the Unix socket is.
type UnixPeer struct {
	// UID is the calling process's user id.
	UID *int `yaml:"uid"`
	// As is "admin" or a tenant's name.
	As string `yaml:"as"`
}

// TLS names the PEM files of a TLS listener.
type TLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Engines configures vLLM manager mode: engines that attach (their spec
// KvtierOffloadingSpec) get a namespace per engine layout whose primary is
// their shared CPU cache.
type Engines struct {
	// Enabled lets engines attach (default true; needs the Unix socket).
	Enabled *bool `yaml:"enabled"`
	// PrimaryBytes is the CPU cache of each engine namespace (default:
	// primary.bytes, or 1GiB when that is 0).
	PrimaryBytes confvalue.ByteSize `yaml:"primary_bytes"`
	// MaxNamespaces bounds the engine namespaces (distinct layouts; default 4).
	MaxNamespaces int `yaml:"max_namespaces"`
}

// On reports whether engines may attach.
func (e Engines) On() bool { return e.Enabled == nil || *e.Enabled }

// Limits bound what one API client can ask for. Zero means the daemon's
// default.
type Limits struct {
	// MaxKeysPerCall bounds the keys (or blocks) of one call (default 65536).
	MaxKeysPerCall int `yaml:"max_keys_per_call"`
	// MaxKeyBytes bounds one key (default and maximum 1024).
	MaxKeyBytes int `yaml:"max_key_bytes"`
	// MaxMessageBytes bounds one API message (default 64MiB); PutBlocks and
	// GetBlocks carry at most this much block data per call.
	MaxMessageBytes confvalue.ByteSize `yaml:"max_message_bytes"`
	// MaxReceiveBytes bounds the request bytes the daemon receives at
	// once, over all connections (default 16 × max_message_bytes): every
	// call reserves max_message_bytes before its request is read, and
	// waits while the reservations are at this bound.
	MaxReceiveBytes confvalue.ByteSize `yaml:"max_receive_bytes"`
	// ReceiveTimeout bounds the time from a call's reservation to its
	// whole request (default 30s): a trickle cannot hold a reservation.
	ReceiveTimeout confvalue.Duration `yaml:"receive_timeout"`
	// MaxRequests bounds the active requests (default 65536).
	MaxRequests int `yaml:"max_requests"`
	// MaxSessionRequests bounds the active requests of one client session
	// (connection) in a namespace (default max_requests / 4), so that no
	// single client can take every request slot.
	MaxSessionRequests int `yaml:"max_session_requests"`
	// MaxTenantRequests bounds one tenant's active requests per namespace
	// over all its connections (default max_requests / 4).
	MaxTenantRequests int `yaml:"max_tenant_requests"`
	// StreamRequestTimeout and StreamMinRate bound a block-stream get or
	// put as a whole: the timeout (default 30s) plus its bytes at the rate
	// (default 4MiB, per second), so that a trickle cannot hold the slots
	// it pins or reserves.
	StreamRequestTimeout confvalue.Duration `yaml:"stream_request_timeout"`
	StreamMinRate        confvalue.ByteSize `yaml:"stream_min_rate"`
	// MaxParamsBytes bounds one kv_transfer_params document (default 64KiB).
	MaxParamsBytes confvalue.ByteSize `yaml:"max_params_bytes"`
	// MaxWait caps GetBlocks' wait (default 10s).
	MaxWait confvalue.Duration `yaml:"max_wait"`
	// MaxSessionParamsBytes and MaxParamsBytesTotal bound the
	// kv_transfer_params the active requests hold, per client session
	// (default 64MiB) and in all (default 256MiB).
	MaxSessionParamsBytes confvalue.ByteSize `yaml:"max_session_params_bytes"`
	MaxParamsBytesTotal   confvalue.ByteSize `yaml:"max_params_bytes_total"`
}

// Events configures KV event publishing (vLLM's KVEventsConfig, docs/semantics.md §6.5).
type Events struct {
	// Enabled turns publishing on (default off).
	Enabled bool `yaml:"enabled"`
	// Endpoint of the ZMQ PUB socket (default tcp://127.0.0.1:5557, bound:
	// loopback, where vLLM binds every interface).
	Endpoint string `yaml:"endpoint"`
	// Mode is bind or connect for Endpoint; absent follows vLLM: bind
	// when the endpoint contains "*" or "::" or is ipc://, else connect
	// (to a subscriber that binds).
	Mode EventsMode `yaml:"mode"`
	// ReplayEndpoint of the ROUTER replay socket ("" = no replay).
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Topic of every batch ("" = kv@<host>:<port>@<model>).
	Topic string `yaml:"topic"`
	// BufferSteps, HWM and MaxQueueSize as in vLLM (0 = vLLM's defaults).
	BufferSteps  int `yaml:"buffer_steps"`
	HWM          int `yaml:"hwm"`
	MaxQueueSize int `yaml:"max_queue_size"`
	// DPRank is the data-parallel rank written into batches.
	DPRank int `yaml:"dp_rank"`
	// SelfDescribing publishes token metadata sent with PrepareStore
	// (vLLM's self_describing_kv_events).
	SelfDescribing bool `yaml:"self_describing"`
	// Positional encodes events as the arrays of vLLM <= 0.23.
	Positional bool `yaml:"positional"`
	// RawHashes publishes full hash bytes instead of the low 64 bits.
	RawHashes bool `yaml:"raw_hashes"`
	// MediumNames renames media on the wire for routers with another
	// vocabulary, e.g. {storage: DISK}.
	MediumNames MediumNames `yaml:"medium_names"`
}

// EventsMode is how the event publisher reaches its endpoint: bind,
// connect, or "" for vLLM's rule (see Events.Mode).
type EventsMode string

// Event endpoint modes.
const (
	EventsBind    EventsMode = "bind"
	EventsConnect EventsMode = "connect"
)

// UnmarshalYAML implements yaml.Unmarshaler.
func (m *EventsMode) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, string(EventsBind), string(EventsConnect))
	if err != nil {
		return err
	}
	*m = EventsMode(s)
	return nil
}

// MediumNames are the names KV events give the media, keyed cpu and
// storage (case-insensitive) in YAML. An empty name keeps the canonical
// one (CPU, STORAGE).
type MediumNames struct {
	CPU, Storage string
}

// decodeNode implements nodeDecoder: a key outside the two media or an
// empty name is an error naming its key, which a plain map would not give.
func (m *MediumNames) decodeNode(d *decoder, n *yaml.Node, path string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping such as {storage: DISK}, got %s", confvalue.Describe(n))
		return
	}
	seen := make(map[string]int, 2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := resolve(n.Content[i]), resolve(n.Content[i+1])
		if kn.Kind != yaml.ScalarNode {
			d.errorf(kn, path, "keys must be strings, got %s", confvalue.Describe(kn))
			continue
		}
		p := joinPath(path, kn.Value)
		key := strings.ToLower(kn.Value)
		var dst *string
		switch key {
		case "cpu":
			dst = &m.CPU
		case "storage":
			dst = &m.Storage
		default:
			d.errorf(kn, p, "unknown medium (want cpu or storage)")
			continue
		}
		if first, dup := seen[key]; dup {
			d.errorf(kn, p, "duplicate medium (first set on line %d)", first)
			continue
		}
		seen[key] = kn.Line
		if vn == nil || vn.Kind != yaml.ScalarNode || isNull(vn) || strings.TrimSpace(vn.Value) == "" {
			got := "nothing"
			if vn != nil && !isNull(vn) {
				got = confvalue.Describe(vn)
			}
			at := vn
			if at == nil {
				at = kn
			}
			d.errorf(at, p, "want the medium's name on the wire, a non-empty string such as DISK, got %s", got)
			continue
		}
		*dst = vn.Value
	}
}

// Daemon defaults.
const (
	DefaultUnixSocket      = "./kvtier.sock"
	DefaultTCPAddr         = "127.0.0.1:7070"
	DefaultMetricsAddr     = "127.0.0.1:9464"
	DefaultShutdownTimeout = confvalue.Duration(10 * time.Second)
)

// defaultServer is the server section of an empty file.
func defaultServer() Server {
	return Server{
		UnixSocket:      DefaultUnixSocket,
		TCPAddr:         DefaultTCPAddr,
		MetricsAddr:     DefaultMetricsAddr,
		ShutdownTimeout: DefaultShutdownTimeout,
	}
}

// checkDaemon applies the rules of the daemon sections.
func (c *Config) checkDaemon(d *decoder) {
	if err := CheckToken(c.Server.AuthToken); c.Server.AuthToken != "" && err != nil {
		d.errorf(nil, "server.auth_token", "%v", err)
	}
	if countSet(c.Server.AuthToken, c.Server.AuthTokenFile, c.Server.AuthTokenEnv) > 1 {
		d.errorf(nil, "server.auth_token_file", "set one of server.auth_token, server.auth_token_file and server.auth_token_env")
	}
	if c.Server.UnixSocket == "" && c.Server.TCPAddr == "" {
		d.errorf(nil, "server", "neither unix_socket nor tcp_addr is set: the API would be unreachable")
	}
	c.checkUnixPeers(d)
	if c.Server.MaxConnectionsPerPeer < -1 {
		d.errorf(nil, "server.max_connections_per_peer", "want a count, or -1 for no bound of its own, got %d", c.Server.MaxConnectionsPerPeer)
	}
	if c.Server.ShutdownTimeout < 0 {
		d.errorf(nil, "server.shutdown_timeout", "must not be negative, got %s", time.Duration(c.Server.ShutdownTimeout))
	}
	for _, f := range []struct {
		path string
		v    int64
	}{
		{"limits.max_keys_per_call", int64(c.Limits.MaxKeysPerCall)},
		{"limits.max_key_bytes", int64(c.Limits.MaxKeyBytes)},
		{"limits.max_message_bytes", int64(c.Limits.MaxMessageBytes)},
		{"limits.max_receive_bytes", int64(c.Limits.MaxReceiveBytes)},
		{"limits.receive_timeout", int64(c.Limits.ReceiveTimeout)},
		{"limits.max_requests", int64(c.Limits.MaxRequests)},
		{"limits.max_session_requests", int64(c.Limits.MaxSessionRequests)},
		{"limits.max_tenant_requests", int64(c.Limits.MaxTenantRequests)},
		{"limits.stream_request_timeout", int64(c.Limits.StreamRequestTimeout)},
		{"limits.stream_min_rate", int64(c.Limits.StreamMinRate)},
		{"limits.max_params_bytes", int64(c.Limits.MaxParamsBytes)},
		{"limits.max_wait", int64(c.Limits.MaxWait)},
		{"limits.max_session_params_bytes", int64(c.Limits.MaxSessionParamsBytes)},
		{"limits.max_params_bytes_total", int64(c.Limits.MaxParamsBytesTotal)},
		{"server.request_idle_timeout", int64(c.Server.RequestIdleTimeout)},
		{"server.max_connections", int64(c.Server.MaxConnections)},

		{"server.connection_idle_timeout", int64(c.Server.ConnectionIdleTimeout)},
		{"server.keepalive_time", int64(c.Server.KeepaliveTime)},
		{"server.keepalive_timeout", int64(c.Server.KeepaliveTimeout)},
		{"server.max_streams_per_connection", int64(c.Server.MaxStreamsPerConnection)},
		{"events.buffer_steps", int64(c.Events.BufferSteps)},
		{"events.hwm", int64(c.Events.HWM)},
		{"events.max_queue_size", int64(c.Events.MaxQueueSize)},
		{"events.dp_rank", int64(c.Events.DPRank)},
	} {
		if f.v < 0 {
			d.errorf(nil, f.path, "must not be negative, got %d", f.v)
		}
	}
	if c.Limits.MaxKeyBytes > 1024 {
		d.errorf(nil, "limits.max_key_bytes", "%d exceeds the maximum key length 1024", c.Limits.MaxKeyBytes)
	}
}

// Cascades bounds the primary slots cascades pin and paces cascades to
// slow tiers (tiering.BudgetConfig, tiering.AdmissionConfig). Zero values
// are the defaults.
type Cascades struct {
	// PinBudget is the share of the primary's slots that cascades in
	// flight may pin together, in (0, 1], or "off" for no bound (default
	// 0.25; BENCHMARKS.md "Cascade pin budget" measures the fractions).
	PinBudget string `yaml:"pin_budget"`
	// TierShare is the share of the pin budget one tier's cascades may pin
	// when there are several tiers, in (0, 1] (default 0.5; 1 with one
	// tier).
	TierShare float64 `yaml:"tier_share"`
	// MaxDeferredBlocks bounds the blocks of the cascades that wait for
	// the pin budget instead of being dropped (default 0: as many as the
	// primary has slots; -1: no waiting, a cascade over the budget is
	// dropped at once).
	MaxDeferredBlocks int `yaml:"max_deferred_blocks"`
	// BackPressure drops cascades to a tier whose cascades have become
	// slow, until they are fast again.
	BackPressure BackPressure `yaml:"back_pressure"`
}

// BackPressure is a tier's cascade back-pressure (tiering.AdmissionConfig):
// an EMA of cascade latency with hysteresis.
type BackPressure struct {
	// Enabled turns it on (default true).
	Enabled *bool `yaml:"enabled"`
	// Alpha is the EMA weight of a new latency sample, in (0, 1] (0.3).
	Alpha float64 `yaml:"alpha"`
	// High turns back-pressure on when the EMA exceeds it (1s); Low turns
	// it off again below it (500ms; at most High).
	High confvalue.Duration `yaml:"high"`
	Low  confvalue.Duration `yaml:"low"`
	// Warmup is the number of first samples ignored (3); -1 for none.
	Warmup int `yaml:"warmup"`
}

// Prefetch bounds the prefetches routers and agents ask for
// (tiering.PrefetchConfig). Zero values are the defaults.
type Prefetch struct {
	// Share is the share of the primary's slots that prefetch promotions
	// may hold in flight, in (0, 1], or "off" (default 0.25).
	Share string `yaml:"share"`
	// MaxQueued bounds the prefetches waiting at once (default 1024).
	MaxQueued int `yaml:"max_queued"`
}

// ShareValue returns Share as a share: 0 for the default, -1 for "off".
func (p Prefetch) ShareValue() (float64, error) { return shareValue(p.Share) }

// shareValue reads a share of the primary in (0, 1], or "off" (-1); ""
// is the default (0).
func shareValue(s string) (float64, error) {
	switch s {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, fmt.Errorf(`want a share of the primary in (0, 1] or "off", got %q`, s)
	}
	return f, nil
}

func (c *Config) checkPrefetch(d *decoder) {
	if _, err := c.Prefetch.ShareValue(); err != nil {
		d.errorf(nil, "prefetch.share", "%v", err)
	}
	if c.Prefetch.MaxQueued < 0 {
		d.errorf(nil, "prefetch.max_queued", "want a positive bound (0: 1024), got %d", c.Prefetch.MaxQueued)
	}
}

// Pins bounds the pins routers and agents hold (tiering.PinConfig).
type Pins struct {
	// Share is the share of an owner's quota (of the primary without
	// tenants) its pinned blocks may hold, in (0, 1], or "off" (default
	// 0.25).
	Share string `yaml:"share"`
}

// ShareValue returns Share as a share: 0 for the default, -1 for "off".
func (p Pins) ShareValue() (float64, error) { return shareValue(p.Share) }

func (c *Config) checkPins(d *decoder) {
	if _, err := c.Pins.ShareValue(); err != nil {
		d.errorf(nil, "pins.share", "%v", err)
	}
}

// Regions configures vLLM tier mode (region.Config). Zero values are the
// defaults.
type Regions struct {
	// MaxRegions bounds the regions registered at once (64).
	MaxRegions int `yaml:"max_regions"`
	// MaxRequests bounds the requests one region holds state for (65536).
	MaxRequests int `yaml:"max_requests"`
	// LookupWait bounds how long a lookup waits for tiers that answer
	// asynchronously before it answers "unknown" for keys they have not
	// settled (2s).
	LookupWait confvalue.Duration `yaml:"lookup_wait"`
	// Tick is how often a namespace's executor polls its tiers while work
	// is pending (1ms).
	Tick confvalue.Duration `yaml:"tick"`
}

// PinBudgetShare returns PinBudget as a share: 0 for the default, -1 for
// "off".
func (c Cascades) PinBudgetShare() (float64, error) {
	switch c.PinBudget {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	f, err := strconv.ParseFloat(c.PinBudget, 64)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, fmt.Errorf(`want a share of the primary in (0, 1] or "off", got %q`, c.PinBudget)
	}
	return f, nil
}

func (c *Config) checkCascades(d *decoder) {
	k := c.Cascades
	if _, err := k.PinBudgetShare(); err != nil {
		d.errorf(nil, "cascades.pin_budget", "%v", err)
	}
	if k.TierShare != 0 && !(k.TierShare > 0 && k.TierShare <= 1) {
		d.errorf(nil, "cascades.tier_share", "want a share of the pin budget in (0, 1], got %v", k.TierShare)
	}
	if k.MaxDeferredBlocks < -1 {
		d.errorf(nil, "cascades.max_deferred_blocks", "want 0 (as many as the primary has slots), -1 (off) or a positive bound, got %d", k.MaxDeferredBlocks)
	}
	b := k.BackPressure
	if b.Alpha != 0 && !(b.Alpha > 0 && b.Alpha <= 1) {
		d.errorf(nil, "cascades.back_pressure.alpha", "want an EMA weight in (0, 1], got %v", b.Alpha)
	}
	if b.High < 0 || b.Low < 0 {
		d.errorf(nil, "cascades.back_pressure", "high and low must not be negative")
	} else if b.High > 0 && b.Low > b.High {
		d.errorf(nil, "cascades.back_pressure.low", "%v is above high %v", time.Duration(b.Low), time.Duration(b.High))
	}
	if b.Warmup < -1 {
		d.errorf(nil, "cascades.back_pressure.warmup", "want samples to ignore, or -1 for none; got %d", b.Warmup)
	}
	r := c.Regions
	for _, v := range []struct {
		key string
		n   int64
	}{
		{"regions.max_regions", int64(r.MaxRegions)}, {"regions.max_requests", int64(r.MaxRequests)},
		{"regions.lookup_wait", int64(r.LookupWait)}, {"regions.tick", int64(r.Tick)},
	} {
		if v.n < 0 {
			d.errorf(nil, v.key, "must not be negative")
		}
	}
}

// checkUnixPeers applies the rules of server.unix_peers.
func (c *Config) checkUnixPeers(d *decoder) {
	if len(c.Server.UnixPeers) == 0 {
		return
	}
	if countSet(c.Server.AuthToken, c.Server.AuthTokenFile, c.Server.AuthTokenEnv) == 0 && len(c.Tenants) == 0 {
		d.errorf(nil, "server.unix_peers", "set without server.auth_token or tenants: without tokens every caller on the Unix socket is the admin already")
	}
	if c.Server.UnixSocket == "" {
		d.errorf(nil, "server.unix_peers", "set without server.unix_socket")
	}
	tenants := map[string]bool{}
	for _, t := range c.Tenants {
		tenants[t.Name] = true
	}
	seen := map[int]int{}
	for i, p := range c.Server.UnixPeers {
		path := fmt.Sprintf("server.unix_peers[%d]", i)
		switch {
		case p.UID == nil:
			d.errorf(nil, path+".uid", "required: the calling process's user id")
			continue
		case *p.UID < 0:
			d.errorf(nil, path+".uid", "must not be negative, got %d", *p.UID)
		}
		if j, dup := seen[*p.UID]; dup {
			d.errorf(nil, path+".uid", "uid %d is also server.unix_peers[%d]", *p.UID, j)
		}
		seen[*p.UID] = i
		if p.As != "admin" && !tenants[p.As] {
			d.errorf(nil, path+".as", "%q is neither \"admin\" nor a tenant's name", p.As)
		}
	}
}

// UnixPeerMap returns server.unix_peers as uid → "admin" or tenant name.
func (s Server) UnixPeerMap() map[int]string {
	if len(s.UnixPeers) == 0 {
		return nil
	}
	m := make(map[int]string, len(s.UnixPeers))
	for _, p := range s.UnixPeers {
		if p.UID != nil {
			m[*p.UID] = p.As
		}
	}
	return m
}
