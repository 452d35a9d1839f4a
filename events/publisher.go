package events

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/offload"
)

// ErrClosed reports a Publish after Close.
var ErrClosed = errors.New("events: publisher closed")

// Defaults of vLLM's KVEventsConfig (docs/semantics.md §6.5), but for the endpoint:
// vLLM binds every interface (tcp://*:5557); kvtier binds loopback, since
// its events name the blocks of every engine and tenant it serves. A router
// on another host needs endpoint tcp://*:5557 (or an address) set.
const (
	DefaultEndpoint     = "tcp://127.0.0.1:5557"
	DefaultBufferSteps  = 10000
	DefaultHWM          = 100000
	DefaultMaxQueueSize = 100000
)

// Endpoint modes (Config.Mode).
const (
	ModeAuto    = ""        // vLLM's rule, see Config.Mode
	ModeBind    = "bind"    // always bind
	ModeConnect = "connect" // always connect
)

// Config configures a Publisher. Zero values select vLLM's defaults.
type Config struct {
	// Endpoint of the PUB socket (default tcp://127.0.0.1:5557, bound);
	// tcp:// and ipc://.
	Endpoint string
	// ReplayEndpoint of the ROUTER replay socket, always bound; "" disables
	// replay.
	ReplayEndpoint string
	// Mode chooses bind or connect for Endpoint. ModeAuto follows vLLM:
	// bind when the endpoint contains "*" or "::" or is ipc://, otherwise
	// connect (to a subscriber that binds).
	Mode string
	// Topic is the first frame of every batch; "" selects
	// kv@<host>:<port>@<model> (kv@<host>@<model> for ipc), the shape
	// llm-d parses into pod and model.
	Topic string
	// Host for the default topic; "" uses os.Hostname.
	Host string
	// Model for the default topic.
	Model string
	// DPRank is written into every batch, and offsets the endpoints as vLLM
	// does: tcp port + rank; ipc path + "_dp<rank>" (rank 0 unchanged).
	DPRank int
	// BufferSteps is how many recent batches replay keeps (default 10000).
	BufferSteps int
	// HWM bounds each subscriber's queue in batches (default 100000); a
	// subscriber that falls further behind loses its oldest batches.
	HWM int
	// MaxConns bounds the connections of each bound socket, PUB and
	// replay (default zmtp.DefaultMaxConns).
	MaxConns int
	// MaxQueueSize bounds the batches waiting to be handed to the socket
	// (default 100000); when full the oldest is dropped.
	MaxQueueSize int
	// Format of the msgpack payload.
	Format Format
	// Tracker configures translation (media names, self-describing events).
	Tracker TrackerConfig
	Logger  *slog.Logger
	// Now stamps batches (default time.Now); for tests.
	Now func() time.Time
}

// Stats are the publisher's counters.
type Stats struct {
	// BatchesPublished and EventsPublished count what was handed to the
	// socket (every subscriber's queue).
	BatchesPublished uint64
	EventsPublished  uint64
	// BatchesDropped counts batches dropped because the queue was full;
	// each leaves a gap in the sequence (replay may still have it).
	BatchesDropped uint64
	// NextSeq is the sequence number of the next batch.
	NextSeq uint64
	// Queued is the number of batches waiting for the sender.
	Queued int
	// SubscriberDrops counts batches dropped from subscriber queues (HWM),
	// including subscribers that have gone; Subscribers details each
	// connected one.
	SubscriberDrops uint64
	Subscribers     []zmtp.PeerStats
	// ReplayRequests and ReplayedBatches count replay traffic;
	// ReplayRejected counts malformed requests.
	ReplayRequests  uint64
	ReplayedBatches uint64
	ReplayRejected  uint64
	// MetadataEntries is the size of the tracker's side table and
	// MetadataEvicted what its bound evicted.
	MetadataEntries int
	MetadataEvicted uint64
}

// batchMsg is one published batch, immutable once queued; its frames are
// shared by the send queue, the replay buffer and every subscriber queue.
type batchMsg struct {
	frames [3][]byte // topic, seq (8 bytes big-endian), payload
	seq    uint64
	events int
}

// Publisher translates offloading events, encodes them and publishes them
// over ZMQ with vLLM's framing: [topic, seq, payload]. Publish never
// blocks: batches go through a bounded queue to a sender goroutine that
// hands them to every subscriber's own bounded queue.
//
// Replay keeps the last BufferSteps batches in sequence order, including
// batches that the queue dropped, so a consumer that sees a gap can fetch
// what it missed while it is still retained.
type Publisher struct {
	cfg     Config
	log     *slog.Logger
	tracker *Tracker
	pub     *zmtp.PubSocket
	router  *zmtp.RouterSocket
	topic   []byte
	addr    net.Addr
	raddr   net.Addr
	now     func() time.Time

	encMu    sync.Mutex // serialises translation and encoding
	batch    Batch
	sizeHint int // payload size of the previous batch

	mu        sync.Mutex
	closed    bool
	nextSeq   uint64
	queue     msgRing
	replay    msgRing
	published uint64
	events    uint64
	dropped   uint64
	rRequests uint64
	rBatches  uint64
	rRejected uint64

	wake       chan struct{}
	senderDone chan struct{}
	// gate is held by the sender while it hands batches to the socket;
	// tests hold it to back the queue up.
	gate sync.Mutex
}

// New validates cfg, binds or connects the sockets and starts the sender.
func New(cfg Config) (*Publisher, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
		if cfg.Mode == ModeAuto {
			cfg.Mode = ModeBind // the default is bound, like vLLM's
		}
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.HWM <= 0 {
		cfg.HWM = DefaultHWM
	}
	if cfg.MaxQueueSize <= 0 {
		cfg.MaxQueueSize = DefaultMaxQueueSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DPRank < 0 {
		return nil, fmt.Errorf("events: dp_rank %d is negative", cfg.DPRank)
	}
	tr, err := NewTracker(cfg.Tracker)
	if err != nil {
		return nil, err
	}
	endpoint, err := OffsetEndpoint(cfg.Endpoint, cfg.DPRank)
	if err != nil {
		return nil, err
	}
	var bind bool
	switch cfg.Mode {
	case ModeAuto:
		bind = ShouldBind(endpoint)
	case ModeBind:
		bind = true
	case ModeConnect:
	default:
		return nil, fmt.Errorf("events: mode %q (want %q, %q or empty)", cfg.Mode, ModeBind, ModeConnect)
	}

	p := &Publisher{
		cfg:        cfg,
		log:        cfg.Logger,
		tracker:    tr,
		now:        cfg.Now,
		wake:       make(chan struct{}, 1),
		senderDone: make(chan struct{}),
	}
	p.queue.init(cfg.MaxQueueSize)
	p.replay.init(cfg.BufferSteps)
	p.pub = zmtp.NewPub(zmtp.PubOptions{HWM: cfg.HWM, MaxConns: cfg.MaxConns, Logger: cfg.Logger})
	if bind {
		p.addr, err = p.pub.Bind(endpoint)
	} else {
		err = p.pub.Connect(endpoint)
	}
	if err != nil {
		_ = p.pub.Close(context.Background())
		return nil, fmt.Errorf("events.endpoint %q: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		rep, err := OffsetEndpoint(cfg.ReplayEndpoint, cfg.DPRank)
		if err == nil {
			p.router = zmtp.NewRouter(p.serveReplay, zmtp.RouterOptions{MaxConns: cfg.MaxConns, Logger: cfg.Logger})
			p.raddr, err = p.router.Bind(rep)
		}
		if err != nil {
			if p.router != nil {
				_ = p.router.Close()
			}
			_ = p.pub.Close(context.Background())
			return nil, fmt.Errorf("events.replay_endpoint %q: %w", cfg.ReplayEndpoint, err)
		}
	}
	p.topic = []byte(cfg.Topic)
	if cfg.Topic == "" {
		p.topic = []byte(defaultTopic(cfg.Host, cfg.Model, endpoint, p.addr))
	}
	go p.sendLoop()
	return p, nil
}

// ShouldBind is vLLM's rule for the PUB endpoint: bind when it contains
// "*" or "::" or names an ipc:// or inproc:// address, otherwise connect.
func ShouldBind(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// OffsetEndpoint applies vLLM's data-parallel offset: the tcp port grows
// by rank, other endpoints get the suffix "_dp<rank>"; rank 0 is unchanged.
func OffsetEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "tcp://") {
		i := strings.LastIndexByte(endpoint, ':')
		port, err := strconv.Atoi(endpoint[i+1:])
		if i < len("tcp://") || err != nil {
			return "", fmt.Errorf("events: endpoint %q: no numeric port to offset by dp_rank %d", endpoint, rank)
		}
		return endpoint[:i+1] + strconv.Itoa(port+rank), nil
	}
	return endpoint + "_dp" + strconv.Itoa(rank), nil
}

func defaultTopic(host, model, endpoint string, bound net.Addr) string {
	if host == "" {
		host, _ = os.Hostname()
	}
	port := ""
	if ta, ok := bound.(*net.TCPAddr); ok {
		port = strconv.Itoa(ta.Port)
	} else if strings.HasPrefix(endpoint, "tcp://") {
		port = endpoint[strings.LastIndexByte(endpoint, ':')+1:]
	}
	if port == "" {
		return "kv@" + host + "@" + model
	}
	return "kv@" + host + ":" + port + "@" + model
}

// NextSeq returns the sequence number the next batch will get: every
// batch published so far has a smaller one.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nextSeq
}

// Tracker returns the translator, for attaching token metadata.
func (p *Publisher) Tracker() *Tracker { return p.tracker }

// Topic returns the topic frame of every batch.
func (p *Publisher) Topic() string { return string(p.topic) }

// Addr returns the bound PUB address (nil in connect mode).
func (p *Publisher) Addr() net.Addr { return p.addr }

// ReplayAddr returns the bound replay address (nil without replay).
func (p *Publisher) ReplayAddr() net.Addr { return p.raddr }

// Publish translates evs and queues them as one batch, unless they
// translate to nothing (vLLM publishes only non-empty batches). It never
// blocks on the network and keeps no reference to evs. It fails only
// after Close.
func (p *Publisher) Publish(evs []offload.Event) error {
	p.encMu.Lock()
	defer p.encMu.Unlock()
	p.batch.Reset()
	p.tracker.Translate(&p.batch, evs)
	return p.publishLocked(p.batch.Events)
}

// PublishWire queues already translated wire events as one batch, e.g. an
// AllBlocksCleared; like Publish it never blocks.
func (p *Publisher) PublishWire(evs []BlockEvent) error {
	p.encMu.Lock()
	defer p.encMu.Unlock()
	return p.publishLocked(evs)
}

func (p *Publisher) publishLocked(evs []BlockEvent) error {
	if len(evs) == 0 {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return nil
	}
	now := p.now()
	// Seconds plus fraction, not UnixNano/1e9: the quotient of two large
	// doubles rounds worse than Python's time.time().
	ts := float64(now.Unix()) + float64(now.Nanosecond())/1e9
	// Encode straight into the batch's own buffer, sized from the previous
	// batch, so the common case is one allocation and no copy. Sequence and
	// payload share it; subscribers and replay read it without copying.
	data := make([]byte, 8, 8+p.sizeHint+p.sizeHint/8)
	data = p.cfg.Format.AppendBatch(data, ts, evs, p.cfg.DPRank)
	p.sizeHint = len(data) - 8
	m := &batchMsg{events: len(evs)}
	m.frames[0], m.frames[1], m.frames[2] = p.topic, data[:8:8], data[8:]

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	m.seq = p.nextSeq
	p.nextSeq++
	binary.BigEndian.PutUint64(data[:8], m.seq)
	if p.queue.push(m) != nil {
		p.dropped++
	}
	p.replay.push(m)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

func (p *Publisher) sendLoop() {
	defer close(p.senderDone)
	var out []*batchMsg
	for {
		p.mu.Lock()
		for p.queue.n == 0 && !p.closed {
			p.mu.Unlock()
			<-p.wake
			p.mu.Lock()
		}
		out = p.queue.drain(out[:0])
		closed := p.closed
		p.mu.Unlock()

		p.gate.Lock()
		events := 0
		for _, m := range out {
			p.pub.Send(m.frames[:])
			events += m.events
		}
		p.gate.Unlock()
		if len(out) > 0 {
			p.mu.Lock()
			p.published += uint64(len(out))
			p.events += uint64(events)
			p.mu.Unlock()
		}
		clear(out)
		if closed {
			return // Publish refuses batches once closed, so this was the last
		}
	}
}

// terminator is the seq frame of replay's end marker: -1 as a signed
// 64-bit big-endian integer.
var terminator = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers [client_id, "", start_seq] with every retained batch
// from start_seq on as [client_id, "", topic, seq, payload], then
// [client_id, "", "", -1, ""] (docs/semantics.md §6.5; the routing id frame is implicit
// on the wire).
func (p *Publisher) serveReplay(id []byte, msg [][]byte, reply func(...[]byte) error) {
	if len(msg) != 2 || len(msg[0]) != 0 || len(msg[1]) != 8 {
		p.mu.Lock()
		p.rRejected++
		p.mu.Unlock()
		p.log.Warn("events: malformed replay request ignored", "client", fmt.Sprintf("%x", id), "frames", len(msg))
		return
	}
	start := binary.BigEndian.Uint64(msg[1])
	p.mu.Lock()
	var batches []*batchMsg
	for i := 0; i < p.replay.n; i++ {
		if m := p.replay.at(i); m.seq >= start {
			batches = append(batches, m)
		}
	}
	p.rRequests++
	p.rBatches += uint64(len(batches))
	p.mu.Unlock()
	empty := []byte{}
	for _, m := range batches {
		if reply(empty, m.frames[0], m.frames[1], m.frames[2]) != nil {
			return
		}
	}
	_ = reply(empty, empty, terminator, empty)
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	ps := p.pub.Stats()
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		BatchesPublished: p.published,
		EventsPublished:  p.events,
		BatchesDropped:   p.dropped,
		NextSeq:          p.nextSeq,
		Queued:           p.queue.n,
		SubscriberDrops:  ps.Dropped,
		Subscribers:      ps.Peers,
		ReplayRequests:   p.rRequests,
		ReplayedBatches:  p.rBatches,
		ReplayRejected:   p.rRejected,
		MetadataEntries:  p.tracker.Len(),
		MetadataEvicted:  p.tracker.Evicted(),
	}
}

// Close stops accepting batches, hands every queued batch to the
// subscribers and waits, until ctx ends, for them to be written; then it
// closes the sockets. The error reports what could not be delivered in
// time.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	var errs []error
	select {
	case <-p.senderDone:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("events: close: queued batches not handed to the socket: %w", ctx.Err()))
	}
	if err := p.pub.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	if p.router != nil {
		_ = p.router.Close()
	}
	<-p.senderDone // returns promptly: the socket is closed, Send is a no-op
	return errors.Join(errs...)
}

// msgRing is a bounded FIFO of batches: pushing onto a full ring evicts
// the oldest.
type msgRing struct {
	buf   []*batchMsg
	limit int
	head  int
	n     int
}

func (r *msgRing) init(limit int) { r.limit = limit }

// push appends m and returns the batch it evicted, if any.
func (r *msgRing) push(m *batchMsg) (evicted *batchMsg) {
	if r.n == r.limit {
		evicted = r.pop()
	}
	if r.n == len(r.buf) {
		nb := make([]*batchMsg, min(max(64, 2*len(r.buf)), r.limit))
		for i := 0; i < r.n; i++ {
			nb[i] = r.at(i)
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = m
	r.n++
	return evicted
}

func (r *msgRing) pop() *batchMsg {
	m := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return m
}

func (r *msgRing) at(i int) *batchMsg { return r.buf[(r.head+i)%len(r.buf)] }

func (r *msgRing) drain(dst []*batchMsg) []*batchMsg {
	for r.n > 0 {
		dst = append(dst, r.pop())
	}
	return dst
}
