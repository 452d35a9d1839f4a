package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/zeebo/xxh3"

	"github.com/kvtier/kvtier/asynclookup"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
	"github.com/kvtier/kvtier/tlsconfig"
)

// Type is the configured type name of the tier.
const Type = "peer"

// peerParams restricts a peer's answers to its primary: a peer read never
// reaches the peer's secondary tiers, and so never another peer.
const peerParams = `{"kv_load_tiers":[]}`

// storageParams lets a peer answer from its storage tiers too (from_storage):
// a filter without medium CPU, which the peer's own peer tiers (DRAM of
// their peers) never pass, so a read still never goes further.
const storageParams = `{"kv_load_tiers":[{"medium":"storage"}]}`

// ErrCorrupt reports a block whose bytes do not match the checksum the
// peer computed when it read them.
var ErrCorrupt = errors.New("block damaged in transit (checksum mismatch)")

// MaxPeers bounds the peers of one tier.
const MaxPeers = 64

// Bounds of one peer's event index (Config.IndexMaxKeys): 8 bytes per
// bucket, at most two buckets per block.
const (
	DefaultIndexMaxKeys = 1 << 20
	MaxIndexKeys        = 1 << 26
)

// PeerConfig is one peer daemon.
type PeerConfig struct {
	Name string `yaml:"name"`
	// Addr is the peer's API address (host:port, its server.tcp_addr).
	Addr string `yaml:"addr"`
	// Locality is local or remote; empty derives it: loopback is local.
	Locality string `yaml:"locality"`
	// Token is the peer's auth_token, if it has one; TokenEnv names the
	// environment variable holding it instead (a Kubernetes Secret),
	// read when the tier is built (tierset).
	Token    string `yaml:"token"`
	TokenEnv string `yaml:"token_env"`
	// TLS talks TLS to a peer whose API serves it (its server.tls):
	// ca_file to trust (default: the system's roots), cert_file and
	// key_file for mutual TLS, server_name to check instead of the host.
	TLS *tlsconfig.ClientFiles `yaml:"tls"`
	// BlockStream reads blocks over the peer's block stream (default
	// true); false keeps every transfer on the API (GetBlocks).
	BlockStream *bool `yaml:"block_stream"`
}

// Config configures a peer tier; the yaml tags are the keys of a `type:
// peer` entry of secondary_tiers.
type Config struct {
	Name  string       `yaml:"-"`
	Peers []PeerConfig `yaml:"peers"`
	// Namespace is the daemon namespace asked for on every peer (the
	// daemon's own; set by the program).
	Namespace string `yaml:"-"`
	// Timeout bounds one call to a peer (default 2s).
	Timeout time.Duration `yaml:"timeout"`
	// LookupBatch bounds the keys of one existence call (default 1024).
	LookupBatch int `yaml:"lookup_batch"`
	// UnhealthyAfter failed calls in a row mark a peer down for
	// ProbeInterval (defaults 3 and 1s): its keys miss without a call.
	UnhealthyAfter int           `yaml:"unhealthy_after"`
	ProbeInterval  time.Duration `yaml:"probe_interval"`
	// Push cascades stores to peers (default false): each block to one
	// peer the request's store filter allows, into its primary (and its
	// storage tiers; never further).
	Push bool `yaml:"push"`
	// FromStorage also loads blocks the index says a peer holds in its
	// storage tiers (its disk) when the request's filter allows storage
	// at the peer's locality: the peer promotes them into its primary
	// first (GetBlocks with kv_load_tiers [{medium: storage}], which
	// excludes its peer tiers, so still no forwarding). Default false:
	// peers serve their DRAM only. Needs the event index.
	FromStorage bool `yaml:"from_storage"`
	// EventIndex follows each peer's KV events to know what it holds
	// (default true): lookups are answered from the index, without a
	// call, while it is current. false asks every step.
	EventIndex *bool `yaml:"event_index"`
	// IndexMaxKeys bounds the index of one peer (default 1<<20 blocks,
	// 16 MiB at most); a peer holding more is asked instead.
	IndexMaxKeys int `yaml:"index_max_keys"`
	// ResyncInterval is the wait before following a peer's events again
	// after the feed broke (default 10s; a sequence gap that replay
	// cannot fill resyncs at once).
	ResyncInterval time.Duration `yaml:"resync_interval"`

	Logger *slog.Logger `yaml:"-"`
}

func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.LookupBatch == 0 {
		c.LookupBatch = 1024
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = 3
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = time.Second
	}
	if c.IndexMaxKeys == 0 {
		c.IndexMaxKeys = DefaultIndexMaxKeys
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = 10 * time.Second
	}
	return c
}

// Validate checks c without connecting; errors name the key.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("peer tier %q: %s: %s", c.Name, key, fmt.Sprintf(format, args...))
	}
	switch {
	case len(c.Peers) == 0:
		return bad("peers", "required: at least one {name, addr}")
	case len(c.Peers) > MaxPeers:
		return bad("peers", "%d peers, at most %d", len(c.Peers), MaxPeers)
	case c.Timeout < 0:
		return bad("timeout", "must be > 0, got %v", c.Timeout)
	case c.LookupBatch < 0:
		return bad("lookup_batch", "must be > 0, got %d", c.LookupBatch)
	case c.UnhealthyAfter < 0:
		return bad("unhealthy_after", "must be > 0, got %d", c.UnhealthyAfter)
	case c.ProbeInterval < 0:
		return bad("probe_interval", "must be > 0, got %v", c.ProbeInterval)
	case c.IndexMaxKeys < 0 || c.IndexMaxKeys > MaxIndexKeys:
		return bad("index_max_keys", "must be in 1..%d, got %d", MaxIndexKeys, c.IndexMaxKeys)
	case c.ResyncInterval < 0:
		return bad("resync_interval", "must be > 0, got %v", c.ResyncInterval)
	}
	names := map[string]bool{}
	for i, p := range c.Peers {
		key := fmt.Sprintf("peers[%d]", i)
		if p.Name == "" {
			return bad(key+".name", "required")
		}
		if names[p.Name] {
			return bad(key+".name", "duplicate peer %q", p.Name)
		}
		names[p.Name] = true
		if _, port, err := net.SplitHostPort(p.Addr); err != nil || port == "" {
			return bad(key+".addr", "%q is not host:port", p.Addr)
		}
		if _, err := LocalityOf(p); err != nil {
			return bad(key+".locality", "%v", err)
		}
	}
	return nil
}

// LocalityOf returns the peer's configured locality, or local for a
// loopback address and remote otherwise.
func LocalityOf(p PeerConfig) (offload.Locality, error) {
	if p.Locality != "" {
		return confvalue.ParseLocality(p.Locality)
	}
	host, _, _ := net.SplitHostPort(p.Addr)
	if host == "localhost" {
		return offload.LocalityLocal, nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return offload.LocalityLocal, nil
	}
	return offload.LocalityRemote, nil
}

// peer is one peer daemon as the tier sees it.
type peer struct {
	cfg      PeerConfig
	locality offload.Locality
	c        *client.Client
	lookups  *asynclookup.Manager

	fails      atomic.Int32
	downUntil  atomic.Int64 // unix nanoseconds; 0 = up
	contacts   atomic.Int64 // existence calls and loads sent
	served     atomic.Int64 // blocks loaded from it
	goneBlocks atomic.Int64 // blocks it no longer had at load time
	pushed     atomic.Int64 // blocks pushed to it (stored or already held)
	nameHash   uint64       // of its name, for rendezvous hashing
	corrupt    atomic.Int64 // blocks whose checksum did not match

	// hints is what the peer's events say it holds; indexed reports that
	// they are current, so lookups read them instead of asking. The feed
	// goroutine is their only writer (feed.go).
	hints    *hints
	indexed  atomic.Bool
	feed     feedStats
	feedDone chan struct{} // closed when the feed goroutine ends; nil without one
	gone     chan uint64   // tag | media of indexed blocks a load found gone
}

// lost records that a load found keys gone from p's media m (or damaged):
// counted, misses for the existence verdicts, forgotten by the index.
func (p *peer) lost(keys []offload.Key, m uint64) {
	if len(keys) == 0 {
		return
	}
	p.goneBlocks.Add(int64(len(keys)))
	p.lookups.MarkMiss(keys)
	p.forget(keys, m)
}

// forget tells the feed that the peer no longer holds keys in media m
// although the index said so (its primary was reset, which publishes no
// events). It never blocks: a full backlog drops the news.
func (p *peer) forget(keys []offload.Key, m uint64) {
	if p.gone == nil || !p.indexed.Load() {
		return
	}
	for _, k := range keys {
		select {
		case p.gone <- keyTag(k) | m:
		default:
			return
		}
	}
}

// up reports whether the peer may be asked: it is not marked down, or its
// down period has passed. The common case reads one atomic, no clock.
func (p *peer) up() bool {
	d := p.downUntil.Load()
	return d == 0 || downPassed(d)
}

// downPassed is up's clock read, out of line so that up inlines.
func downPassed(until int64) bool { return time.Now().UnixNano() >= until }

// Tier is the peer tier. It implements offload.SecondaryTier and
// offload.ReadOnly.
type Tier struct {
	cfg   Config
	log   *slog.Logger
	peers []*peer

	// jobs answers every load once (remote tiers' job table: at most
	// remote's default in flight, Close cancels and answers the rest).
	jobs *remote.JobTable
	// reqSeq numbers the requests the tier opens on peers.
	reqSeq atomic.Uint64
	// stopFeeds ends the peers' feed goroutines.
	stopFeeds context.CancelFunc
}

var (
	_ offload.SecondaryTier = (*Tier)(nil)
	_ offload.ReadOnly      = (*Tier)(nil)
)

// New validates cfg and connects to every peer (lazily: a peer that is
// down at start is a peer that misses until it answers).
func New(cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tier{cfg: cfg, log: cfg.Logger}
	if t.log == nil {
		t.log = slog.Default()
	}
	t.log = t.log.With("tier", cfg.Name, "type", Type)
	t.jobs = remote.NewJobTable(fmt.Sprintf("peer tier %q", cfg.Name), 0)
	for _, pc := range cfg.Peers {
		loc, _ := LocalityOf(pc)
		// Reconnects never back off past probe_interval: a peer back after
		// a long outage is used as soon as after a short one.
		opts := client.Options{Token: pc.Token, Namespace: cfg.Namespace, StreamTimeout: cfg.Timeout, MaxReconnectDelay: cfg.ProbeInterval}
		tc, err := pc.TLS.Config()
		if err != nil {
			t.closePeers()
			return nil, fmt.Errorf("peer tier %q: peer %q: %w", cfg.Name, pc.Name, err)
		}
		opts.TLS = tc
		c, err := client.Dial(pc.Addr, opts)
		if err != nil {
			t.closePeers()
			return nil, fmt.Errorf("peer tier %q: peer %q at %s: %w", cfg.Name, pc.Name, pc.Addr, err)
		}
		p := &peer{cfg: pc, locality: loc, c: c, nameHash: xxh3.HashString(pc.Name)}
		p.lookups = asynclookup.New(fmt.Sprintf("peer tier %q, peer %q", cfg.Name, pc.Name), t.existsOn(p),
			asynclookup.Options{MaxBatch: cfg.LookupBatch, Timeout: cfg.Timeout, Logger: t.log})
		t.peers = append(t.peers, p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.stopFeeds = cancel
	if cfg.EventIndex == nil || *cfg.EventIndex {
		for _, p := range t.peers {
			p.hints = newHints(cfg.IndexMaxKeys)
			p.feedDone = make(chan struct{})
			p.gone = make(chan uint64, goneBacklog)
			go t.runFeed(ctx, p)
		}
	}
	return t, nil
}

func (t *Tier) Name() string               { return t.cfg.Name }
func (t *Tier) Type() string               { return Type }
func (t *Tier) Medium() offload.Medium     { return offload.MediumUnspecified }
func (t *Tier) Locality() offload.Locality { return offload.LocalityUnspecified }

// ReadOnly reports whether the tier takes no cascades: true unless push
// is on.
func (t *Tier) ReadOnly() bool { return !t.cfg.Push }

// source is where a load takes a block from on a peer.
type source uint8

const (
	none      source = iota
	fromDRAM         // the peer's primary (block stream or GetBlocks)
	fromStore        // the peer's storage tiers, promoted there first
)

// allowed reports which of peer p's media req's load filter allows: its
// DRAM (CPU), and its storage tiers when the tier reads them.
func (t *Tier) allowed(req *offload.ReqContext, p *peer) (dram, store bool) {
	if req == nil {
		return true, t.cfg.FromStorage
	}
	dram = req.LoadFilter.Allows(offload.MediumCPU, p.locality)
	if t.cfg.FromStorage {
		store = req.LoadFilter.Allows(offload.MediumStorage, p.locality)
	}
	return dram, store
}

// stream returns a connection to p's block stream from the peer's client
// (client.StreamPool), nil when the API is to be used.
func (t *Tier) stream(ctx context.Context, p *peer) *client.Stream {
	sc, _ := p.c.Streams().Take(ctx)
	return sc
}

// loadStream is stream for loads, which block_stream: false keeps on the
// API.
func (t *Tier) loadStream(ctx context.Context, p *peer) *client.Stream {
	if p.cfg.BlockStream != nil && !*p.cfg.BlockStream {
		return nil
	}
	return t.stream(ctx, p)
}

// Lookup asks the peers the request's filter allows, in order: Hit when
// one holds the key, Retry while one is being asked, else Miss.
func (t *Tier) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	res := offload.Miss
	var tag uint64
	for _, p := range t.peers {
		if !p.up() {
			continue
		}
		switch v, _ := p.holds(key, &tag, req, t); v {
		case offload.Hit:
			return offload.Hit
		case offload.Retry:
			res = offload.Retry
		}
	}
	return res
}

// holds is p's verdict on key under req's filter, and where a load would
// take it from: from its index while that is current (*tag caches the
// key's tag across peers, 0 until computed), else from the existence
// calls, which see the peer's DRAM only.
func (p *peer) holds(key offload.Key, tag *uint64, req *offload.ReqContext, t *Tier) (offload.LookupResult, source) {
	dram, store := t.allowed(req, p)
	if !dram && !store {
		return offload.Miss, none
	}
	if p.indexed.Load() {
		if *tag == 0 {
			*tag = keyTag(key)
		}
		m := p.hints.media(*tag)
		switch {
		case dram && m&onCPU != 0:
			return offload.Hit, fromDRAM
		case store && m&onStorage != 0:
			return offload.Hit, fromStore
		}
		return offload.Miss, none
	}
	if !dram {
		return offload.Miss, none
	}
	r := p.lookups.Lookup(key, reqID(req))
	if r == offload.Hit {
		return r, fromDRAM
	}
	return r, none
}

func reqID(req *offload.ReqContext) string {
	if req == nil {
		return ""
	}
	return req.ID
}

// existsOn is peer p's batch function: one Lookup of the keys on p, under
// a request whose filter keeps the peer on its primary.
func (t *Tier) existsOn(p *peer) asynclookup.BatchFunc {
	return func(ctx context.Context, keys []offload.Key) ([]bool, error) {
		if !p.up() {
			return nil, fmt.Errorf("peer %q is down", p.cfg.Name)
		}
		p.contacts.Add(1)
		found, err := t.lookupOn(ctx, p, keys)
		t.report(p, err)
		return found, err
	}
}

func (t *Tier) lookupOn(ctx context.Context, p *peer, keys []offload.Key) ([]bool, error) {
	id := fmt.Sprintf("peer-%s-%d", t.cfg.Name, t.reqSeq.Add(1))
	if _, err := p.c.NewRequest(ctx, id, peerParams); err != nil {
		return nil, fmt.Errorf("peer %q: %w", p.cfg.Name, err)
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Timeout)
		_ = p.c.FinishRequest(fctx, id)
		cancel()
	}()
	res, _, err := p.c.Lookup(ctx, id, keys, false)
	if err != nil {
		return nil, fmt.Errorf("peer %q: lookup: %w", p.cfg.Name, err)
	}
	if len(res) != len(keys) {
		return nil, fmt.Errorf("peer %q: lookup answered %d of %d keys", p.cfg.Name, len(res), len(keys))
	}
	found := make([]bool, len(keys))
	for i, r := range res {
		found[i] = r == kvtierv1.LookupResult_LOOKUP_RESULT_HIT
	}
	return found, nil
}

// report counts a call's outcome for the peer's health.
func (t *Tier) report(p *peer, err error) {
	if err == nil {
		if p.fails.Swap(0) >= int32(t.cfg.UnhealthyAfter) {
			t.log.Info("peer answers again", "peer", p.cfg.Name, "addr", p.cfg.Addr)
		}
		p.downUntil.Store(0)
		return
	}
	if errors.Is(err, context.Canceled) {
		return // the tier is closing: not the peer's fault
	}
	if n := p.fails.Add(1); n >= int32(t.cfg.UnhealthyAfter) {
		if n == int32(t.cfg.UnhealthyAfter) {
			t.log.Warn("peer marked down: its blocks miss until it answers", "peer", p.cfg.Name, "addr", p.cfg.Addr, "err", err)
		}
		p.downUntil.Store(time.Now().Add(t.cfg.ProbeInterval).UnixNano())
	}
}

// SubmitLoad loads each key from the first allowed peer that holds it (as
// the verdicts stand at submission), one call per peer, on a goroutine of
// the job's own.
func (t *Tier) SubmitLoad(job *offload.Job) {
	type from struct {
		p   *peer
		src source
	}
	byPeer := make(map[from][]int)
	var order []from
	for i, k := range job.Keys {
		var tag uint64
		for _, p := range t.peers {
			if !p.up() {
				continue
			}
			if v, src := p.holds(k, &tag, job.Req, t); v == offload.Hit {
				f := from{p, src}
				if byPeer[f] == nil {
					order = append(order, f)
				}
				byPeer[f] = append(byPeer[f], i)
				break
			}
		}
	}
	t.jobs.Submit(job, func(ctx context.Context, job *offload.Job) offload.JobResult {
		start := time.Now()
		ok := make([]bool, len(job.Keys))
		err := fanOut(order, func(f from) error { return t.loadFrom(ctx, f.p, f.src, job, byPeer[f], ok) })
		r := offload.JobResult{Success: true, Duration: time.Since(start)}
		for i, k := range job.Keys {
			if ok[i] {
				r.SuccessfulKeys = append(r.SuccessfulKeys, k)
				r.Bytes += int64(job.Arena.SlotSize())
			} else {
				r.Success = false
			}
		}
		if !r.Success {
			r.Err = err
			if r.Err == nil {
				r.Err = fmt.Errorf("peer tier %q: %d of %d blocks held by no allowed peer", t.cfg.Name, len(job.Keys)-len(r.SuccessfulKeys), len(job.Keys))
			}
		}
		return r
	})
}

// fanOut runs fn for every group (the keys of one peer) on a goroutine of
// its own and returns their errors joined once all have returned. A
// single group, the usual case, runs on the caller's goroutine: one
// hand-off fewer on every load.
func fanOut[G any](groups []G, fn func(G) error) error {
	if len(groups) == 1 {
		return fn(groups[0])
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { errs[i] = fn(g) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// loadFrom loads job.Keys[idx] from p's src into their slots and sets ok
// for the blocks that arrived whole.
func (t *Tier) loadFrom(ctx context.Context, p *peer, src source, job *offload.Job, idx []int, ok []bool) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	p.contacts.Add(1)
	if src == fromStore {
		// Promoted on the peer first: GetBlocks waits for it, within half
		// the call timeout so that the answer still arrives in time.
		return t.getFrom(ctx, p, onStorage, job, idx, ok, client.GetOptions{CallOptions: client.CallOptions{Params: storageParams}, Checksums: true, Wait: t.cfg.Timeout / 2})
	}
	if sc := t.loadStream(ctx, p); sc != nil {
		gone, err := t.streamLoad(ctx, p, sc, job, idx, ok)
		if err == nil {
			t.report(p, nil)
			p.lost(gone, onCPU)
			return nil
		}
		// The stream failed: what it did not deliver is a miss now, and
		// the next loads use the API until the stream is learnt again.
		p.c.Streams().Forget()
		var missed []offload.Key
		for _, i := range idx {
			if !ok[i] {
				missed = append(missed, job.Keys[i])
			}
		}
		p.lookups.MarkMiss(missed)
		t.report(p, err)
		return fmt.Errorf("peer %q: block stream: %w", p.cfg.Name, err)
	}
	return t.getFrom(ctx, p, onCPU, job, idx, ok, client.GetOptions{CallOptions: client.CallOptions{Params: peerParams}, Checksums: true})
}

// getFrom loads job.Keys[idx] from p over the API (GetBlocks by value,
// checksummed) and sets ok for the blocks that arrived whole.
func (t *Tier) getFrom(ctx context.Context, p *peer, m uint64, job *offload.Job, idx []int, ok []bool, opts client.GetOptions) error {
	keys := make([]offload.Key, len(idx))
	for j, i := range idx {
		keys[j] = job.Keys[i]
	}
	got, err := p.c.GetBlocks(ctx, keys, opts)
	t.report(p, err)
	if err != nil {
		p.lookups.MarkMiss(keys)
		return fmt.Errorf("peer %q: get: %w", p.cfg.Name, err)
	}
	var gone []offload.Key
	var bad error
	for j, i := range idx {
		if j >= len(got.Results) || got.Results[j] != kvtierv1.LookupResult_LOOKUP_RESULT_HIT || j >= len(got.Data) {
			gone = append(gone, keys[j])
			continue
		}
		slot, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			bad = errors.Join(bad, fmt.Errorf("peer %q: %s: %w", p.cfg.Name, keys[j], err))
			continue
		}
		if len(got.Data[j]) != len(slot) {
			// Another block size: never copy a part of it.
			gone = append(gone, keys[j])
			bad = errors.Join(bad, fmt.Errorf("peer %q: %s: %d-byte block for a %d-byte slot", p.cfg.Name, keys[j], len(got.Data[j]), len(slot)))
			continue
		}
		if j >= len(got.Checksums) || xxh3.Hash(got.Data[j]) != got.Checksums[j] {
			// Damaged on the way (or a peer that sends no checksum):
			// rejected before it reaches the slot.
			p.corrupt.Add(1)
			gone = append(gone, keys[j])
			bad = errors.Join(bad, fmt.Errorf("peer %q: %s: %w", p.cfg.Name, keys[j], ErrCorrupt))
			continue
		}
		copy(slot, got.Data[j])
		ok[i] = true
		p.served.Add(1)
	}
	p.lost(gone, m)
	return bad
}

// SubmitStore pushes a cascade to peers when push is on (it fails
// otherwise: the manager never cascades to a read-only tier). Each block
// goes to one peer among those the request's store filter allows (their
// DRAM at their locality) and that are up, chosen by rendezvous hashing:
// the fleet spreads its blocks, and a key goes to the same peer as long
// as that peer is a candidate. A block no peer may take is left out; the
// job succeeds when every block sent was stored (or was there already).
func (t *Tier) SubmitStore(job *offload.Job) {
	if !t.cfg.Push {
		t.jobs.Fail(job, fmt.Errorf("peer tier %q: read-only (push is off)", t.cfg.Name))
		return
	}
	if len(job.Slots) < len(job.Keys) {
		t.jobs.Fail(job, fmt.Errorf("peer tier %q: store job %d: %d slots for %d keys", t.cfg.Name, job.ID, len(job.Slots), len(job.Keys)))
		return
	}
	byPeer := make(map[*peer][]int)
	var order []*peer
	for i, k := range job.Keys {
		p := t.pushTarget(k, job.Req)
		if p == nil {
			continue
		}
		if byPeer[p] == nil {
			order = append(order, p)
		}
		byPeer[p] = append(byPeer[p], i)
	}
	t.jobs.Submit(job, func(ctx context.Context, job *offload.Job) offload.JobResult {
		start := time.Now()
		var sent atomic.Int64
		err := fanOut(order, func(p *peer) error {
			if err := t.pushTo(ctx, p, job, byPeer[p]); err != nil {
				return err
			}
			sent.Add(int64(len(byPeer[p]) * job.Arena.SlotSize()))
			return nil
		})
		return offload.JobResult{Success: err == nil, Err: err, Duration: time.Since(start), Bytes: sent.Load()}
	})
}

// pushTarget is the peer key goes to under req's store filter, or nil.
func (t *Tier) pushTarget(k offload.Key, req *offload.ReqContext) *peer {
	var best *peer
	var bestScore uint64
	tag := keyTag(k)
	for _, p := range t.peers {
		if req != nil && !req.StoreFilter.Allows(offload.MediumCPU, p.locality) {
			continue
		}
		if !p.up() {
			continue
		}
		if score := (tag ^ p.nameHash) * 0x9e3779b97f4a7c15; best == nil || score > bestScore {
			best, bestScore = p, score
		}
	}
	return best
}

// pushTo sends job.Keys[idx] to p over its block stream as a push (p keeps
// them in its primary and storage tiers, never passing them on).
func (t *Tier) pushTo(ctx context.Context, p *peer, job *offload.Job, idx []int) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	p.contacts.Add(1)
	blocks := make([]client.Block, len(idx))
	for j, i := range idx {
		slot, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return fmt.Errorf("peer %q: push %s: %w", p.cfg.Name, job.Keys[i], err)
		}
		blocks[j] = client.Block{Key: job.Keys[i], Data: slot}
	}
	sc := t.stream(ctx, p)
	if sc == nil {
		err := fmt.Errorf("peer %q: push: no usable block stream", p.cfg.Name)
		t.report(p, err)
		return err
	}
	deadline, _ := ctx.Deadline()
	res, err := sc.Push(blocks, deadline)
	if err != nil {
		sc.Close()
		p.c.Streams().Forget()
		t.report(p, err)
		return fmt.Errorf("peer %q: push: %w", p.cfg.Name, err)
	}
	p.c.Streams().Give(sc)
	t.report(p, nil)
	rejected := 0
	for _, r := range res {
		if r == client.PutRejected {
			rejected++
		}
	}
	p.pushed.Add(int64(len(res) - rejected))
	if rejected > 0 {
		return fmt.Errorf("peer %q: push: %d of %d blocks refused (no room, or damaged on the way)", p.cfg.Name, rejected, len(res))
	}
	return nil
}

// FinishedJobs returns the results since the last call.
func (t *Tier) FinishedJobs() []offload.JobResult { return t.jobs.Take() }

// DrainJobs waits until no load is in flight (or ctx ends).
func (t *Tier) DrainJobs(ctx context.Context) error { return t.jobs.Drain(ctx) }

// HasPendingWork reports loads in flight or existence calls pending.
func (t *Tier) HasPendingWork() bool {
	if t.jobs.Active() > 0 {
		return true
	}
	for _, p := range t.peers {
		if p.lookups.Pending() {
			return true
		}
	}
	return false
}

func (t *Tier) Touch([]offload.Key, *offload.ReqContext)               {}
func (t *Tier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy { return offload.BlockLevel }
func (t *Tier) TakeEvents() []offload.Event                            { return nil }

// OnRequestFinished forgets the request's verdicts.
func (t *Tier) OnRequestFinished(req *offload.ReqContext) {
	for _, p := range t.peers {
		p.lookups.Cleanup(reqID(req))
	}
}

// OnScheduleEnd sends this step's existence checks, one batch per peer.
func (t *Tier) OnScheduleEnd(offload.ScheduleEnd) {
	for _, p := range t.peers {
		p.lookups.Flush()
	}
}

// Close cancels the loads in flight, waits for them until ctx ends
// (answering the rest as failed) and disconnects.
func (t *Tier) Close(ctx context.Context) error {
	err := t.jobs.Close(ctx)
	t.closePeers()
	return err
}

func (t *Tier) closePeers() {
	if t.stopFeeds != nil {
		t.stopFeeds()
	}
	for _, p := range t.peers {
		if p.feedDone != nil {
			<-p.feedDone
		}
	}
	for _, p := range t.peers {
		if p.lookups != nil {
			p.lookups.Close()
		}
		_ = p.c.Close() // and its streams
	}
}

// PeerStats are one peer's counters.
type PeerStats struct {
	Name, Addr string
	Locality   offload.Locality
	Healthy    bool
	// Contacts counts calls sent to the peer (existence batches and
	// loads); Served the blocks loaded from it; Gone the blocks it no
	// longer held when a load asked; Corrupt the blocks rejected because
	// their checksum did not match.
	Contacts, Served, Gone, Corrupt int64
	// Pushed counts the blocks pushed to the peer (push).
	Pushed int64
	// Indexed reports that lookups are answered from the peer's events;
	// IndexKeys is the blocks the index holds, Syncs the passes over the
	// peer's block list, Gaps the event sequence gaps seen, Replayed the
	// batches fetched to fill them, NextSeq the sequence number of the
	// next batch the index expects.
	Indexed                          bool
	IndexKeys, Syncs, Gaps, Replayed int64
	NextSeq                          uint64
}

// Peers returns every peer's counters, in configuration order.
// Report implements offload.Reporter: healthy while some peer answers,
// each peer a node, with its event index, and the corrupt blocks peers
// sent.
func (t *Tier) Report() offload.TierReport {
	r := offload.UnknownOccupancy()
	r.Remote = &offload.RemoteReport{}
	for _, p := range t.Peers() {
		r.CorruptBlocks += uint64(p.Corrupt)
		r.Remote.Healthy = r.Remote.Healthy || p.Healthy
		r.Remote.Nodes = append(r.Remote.Nodes, offload.NodeReport{Addr: p.Name, Healthy: p.Healthy,
			Index: &offload.NodeIndex{Current: p.Indexed, Blocks: p.IndexKeys, Gaps: p.Gaps}})
	}
	return r
}

// Parts declares the sources a request's filter judges one by one: each
// peer's DRAM (CPU), and with from_storage its storage tiers (STORAGE),
// at the peer's locality (explain.Composite).
func (t *Tier) Parts() []explain.Declaration { return PartsOf(t.cfg) }

// PartsOf is Parts for a tier configured by c, before it is built.
func PartsOf(c Config) []explain.Declaration {
	var parts []explain.Declaration
	for _, p := range c.Peers {
		loc, _ := LocalityOf(p)
		parts = append(parts, explain.Declaration{Name: p.Name, Type: "peer " + p.Addr, Medium: offload.MediumCPU, Locality: loc})
		if c.FromStorage {
			parts = append(parts, explain.Declaration{Name: p.Name + " storage", Type: "peer " + p.Addr, Medium: offload.MediumStorage, Locality: loc})
		}
	}
	return parts
}

// Peers returns each peer's state and counters.
func (t *Tier) Peers() []PeerStats {
	out := make([]PeerStats, len(t.peers))
	for i, p := range t.peers {
		out[i] = PeerStats{Name: p.cfg.Name, Addr: p.cfg.Addr, Locality: p.locality, Healthy: p.up(),
			Contacts: p.contacts.Load(), Served: p.served.Load(), Gone: p.goneBlocks.Load(), Corrupt: p.corrupt.Load(), Pushed: p.pushed.Load(),
			Indexed: p.indexed.Load(), IndexKeys: p.feed.keys.Load(), Syncs: p.feed.syncs.Load(), Gaps: p.feed.gaps.Load(), Replayed: p.feed.replayed.Load(), NextSeq: p.feed.next.Load()}
	}
	return out
}
