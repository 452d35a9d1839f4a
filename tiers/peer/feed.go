package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/offload"
)

// Why a feed stops following a peer; each makes the peer's index cold
// (lookups ask the peer) until a new pass over its blocks.
var (
	errNoFeed   = errors.New("peer publishes no KV events over TCP (events off, ipc, or connect mode)")
	errGap      = errors.New("KV event sequence gap that replay could not fill")
	errOverflow = errors.New("peer holds more blocks than index_max_keys")
)

// goneBacklog bounds the blocks found gone waiting for the feed; more are
// dropped (they stay hints until their removal or the next pass).
const goneBacklog = 1024

// listPage is the keys asked for per ListBlocks call.
const listPage = 1 << 14

// replayTimeout bounds one replay exchange.
const replayTimeout = 5 * time.Second

// feedStats are a feed's counters, read by Peers.
type feedStats struct {
	syncs    atomic.Int64  // passes over the peer's blocks
	gaps     atomic.Int64  // sequence gaps seen
	replayed atomic.Int64  // batches fetched by replay
	batches  atomic.Int64  // batches applied
	keys     atomic.Int64  // entries in the index (a gauge)
	next     atomic.Uint64 // sequence number of the next batch expected
}

// runFeed keeps p's index: a pass over the peer's blocks, then its KV
// events, again after any break, until ctx ends. While the index is not
// current (p.indexed false) the tier asks the peer instead.
func (t *Tier) runFeed(ctx context.Context, p *peer) {
	defer close(p.feedDone)
	logged, gapBefore := false, false
	for {
		err := t.follow(ctx, p)
		p.indexed.Store(false)
		if ctx.Err() != nil {
			return
		}
		gap := errors.Is(err, errGap)
		wait := t.feedRetry(gap, gapBefore)
		// Say it once per kind of trouble; a feed that keeps failing in the
		// same way is a peer's configuration, not news every interval.
		if !logged || gap {
			t.log.Info("peer index cold: asking the peer instead", "peer", p.cfg.Name, "err", err, "retry_in", wait)
			logged = !gap
		}
		gapBefore = gap
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// feedRetry is how long to wait before following again: a gap resyncs at
// once, unless the previous attempt ended in one too (a peer whose batches
// keep failing must not be passed over in a loop); anything else after
// resync_interval.
func (t *Tier) feedRetry(gap, gapBefore bool) time.Duration {
	if gap && !gapBefore {
		return 0
	}
	return t.cfg.ResyncInterval
}

// follow subscribes to p's events, passes over its blocks and applies the
// events from the pass's sequence number on, until something breaks.
func (t *Tier) follow(ctx context.Context, p *peer) error {
	sub, replayAddr, err := t.subscribeFeed(ctx, p)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { sub.Close() })
	defer stop()
	defer sub.Close()

	// The pass: what the primary holds, page by page, and the sequence
	// from which the events cover every later change.
	h := p.hints
	h.reset()
	next, cpuName, err := t.listAll(ctx, p, h)
	if err != nil {
		return err
	}
	p.feed.syncs.Add(1)
	p.feed.keys.Store(int64(h.live))
	p.feed.next.Store(next)
	p.indexed.Store(true)
	t.log.Debug("peer index current", "peer", p.cfg.Name, "blocks", h.live, "from_seq", next)
	return t.consumeFeed(ctx, p, sub, replayAddr, next, cpuName)
}

// subscribeFeed subscribes to the peer's KV events: it returns the
// subscription and the address of the peer's replay socket ("" without
// one), or errNoFeed when the peer publishes no events.
func (t *Tier) subscribeFeed(ctx context.Context, p *peer) (sub *zmtp.Conn, replayAddr string, err error) {
	cctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	first, err := p.c.ListBlocks(cctx, 0, 1)
	cancel()
	if err != nil {
		return nil, "", fmt.Errorf("list blocks: %w", err)
	}
	if first.GetEventsPort() == 0 {
		return nil, "", errNoFeed
	}
	host, _, _ := net.SplitHostPort(p.cfg.Addr)
	at := func(port int32) string { return "tcp://" + net.JoinHostPort(host, strconv.Itoa(int(port))) }
	dctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	sub, err = zmtp.Dial(dctx, at(first.GetEventsPort()), zmtp.Sub, nil)
	cancel()
	if err != nil {
		return nil, "", fmt.Errorf("subscribe: %w", err)
	}
	if err := sub.Subscribe([]byte(first.GetEventsTopic())); err != nil {
		sub.Close()
		return nil, "", fmt.Errorf("subscribe: %w", err)
	}
	if first.GetEventsReplayPort() != 0 {
		replayAddr = at(first.GetEventsReplayPort())
	}
	return sub, replayAddr, nil
}

// consumeFeed applies the peer's event batches from sequence next on to
// its index (and the blocks loads found gone), filling a gap by replay,
// until the subscription or the index fails.
func (t *Tier) consumeFeed(ctx context.Context, p *peer, sub *zmtp.Conn, replayAddr string, next uint64, cpuName string) error {
	h := p.hints
	var dec events.Decoder
	apply := func(seq uint64, payload []byte) error {
		evs, err := dec.Decode(payload)
		if err != nil {
			// A batch we cannot read is a batch we missed.
			return fmt.Errorf("%w: batch %d: %v", errGap, seq, err)
		}
		if !applyEvents(h, evs, cpuName) {
			return errOverflow
		}
		p.feed.batches.Add(1)
		p.feed.keys.Store(int64(h.live))
		return nil
	}
	// Batches arrive on their own goroutine, so that the loop also takes
	// the blocks loads found gone (a peer's reset publishes no events).
	msgs := make(chan [][]byte, 64)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- msg:
			case <-done:
				return
			}
		}
	}()
	for {
		var msg [][]byte
		select {
		case err := <-recvErr:
			return fmt.Errorf("events: %w", err)
		case v := <-p.gone:
			h.remove(v&^mediaMask, v&mediaMask)
			p.feed.keys.Store(int64(h.live))
			continue
		case msg = <-msgs:
		}
		if len(msg) != 3 || len(msg[1]) != 8 {
			continue // not a batch of vLLM's framing
		}
		seq := binary.BigEndian.Uint64(msg[1])
		if seq < next {
			continue // before the pass: the pass has it
		}
		if seq > next {
			p.feed.gaps.Add(1)
			if replayAddr == "" {
				return fmt.Errorf("%w: expected batch %d, got %d, no replay", errGap, next, seq)
			}
			// Fills [next, seq); the batch in hand follows.
			if err := t.replay(ctx, p, replayAddr, next, seq, apply); err != nil {
				return err
			}
		}
		if err := apply(seq, msg[2]); err != nil {
			return err
		}
		next = seq + 1
		p.feed.next.Store(next)
	}
}

// listAll fills h with the peer's ready blocks and returns the sequence
// number of the first page (the events from there on complete the pass)
// and the wire name of the peer's primary medium.
func (t *Tier) listAll(ctx context.Context, p *peer, h *hints) (uint64, string, error) {
	var seq uint64
	var cpuName string
	cursor := int64(0)
	for page := 0; ; page++ {
		cctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
		r, err := p.c.ListBlocks(cctx, cursor, listPage)
		cancel()
		if err != nil {
			return 0, "", fmt.Errorf("list blocks: %w", err)
		}
		if page == 0 {
			seq, cpuName = r.GetEventsNextSeq(), r.GetEventsCpuMedium()
		}
		for _, raw := range r.GetKeys() {
			k, err := offload.KeyFromBytes(raw)
			if err != nil {
				continue
			}
			if !h.add(keyTag(k), onCPU) {
				return 0, "", errOverflow
			}
		}
		if cursor = r.GetNextCursor(); cursor == 0 {
			return seq, cpuName, nil
		}
	}
}

// replay fetches batches [from, until) from the peer's replay socket and
// applies them, or returns errGap when the peer no longer has them all.
func (t *Tier) replay(ctx context.Context, p *peer, addr string, from, until uint64, apply func(uint64, []byte) error) error {
	rctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	d, err := zmtp.Dial(rctx, addr, zmtp.Dealer, nil)
	if err != nil {
		return fmt.Errorf("%w: replay: %v", errGap, err)
	}
	defer d.Close()
	stop := context.AfterFunc(rctx, func() { d.Close() })
	defer stop()
	if err := d.Send([]byte{}, binary.BigEndian.AppendUint64(nil, from)); err != nil {
		return fmt.Errorf("%w: replay: %v", errGap, err)
	}
	next := from
	for next < until {
		msg, err := d.Recv()
		if err != nil {
			return fmt.Errorf("%w: replay: %v", errGap, err)
		}
		if len(msg) != 4 || len(msg[2]) != 8 {
			continue
		}
		if len(msg[1]) == 0 { // the end marker
			break
		}
		seq := binary.BigEndian.Uint64(msg[2])
		if seq != next {
			return fmt.Errorf("%w: replay from %d starts at %d", errGap, next, seq)
		}
		if err := apply(seq, msg[3]); err != nil {
			return err
		}
		p.feed.replayed.Add(1)
		next++
	}
	if next < until {
		return fmt.Errorf("%w: replay ended at %d, needed up to %d", errGap, next, until)
	}
	return nil
}

// applyEvents applies a decoded batch to h: a stored block gains its
// medium (its own hash is the last of its hashes), a removed one loses it,
// AllBlocksCleared drops everything. The peer's primary announces CPU
// without a locality; a CPU tier with one (Redis) is not the peer's DRAM
// and is left out; any other medium is the peer's storage. It returns
// false when h is full.
func applyEvents(h *hints, evs []events.Decoded, cpuName string) bool {
	for _, ev := range evs {
		m := onStorage
		if ev.Medium == cpuName {
			if ev.Locality != "" {
				continue // another CPU tier of the peer's, not its primary
			}
			m = onCPU
		}
		switch ev.Type {
		case events.BlockStored:
			if len(ev.Hashes) > 0 && !h.add(tagOf(ev.Hashes[len(ev.Hashes)-1], ev.Group), m) {
				return false
			}
		case events.BlockRemoved:
			for _, hh := range ev.Hashes {
				h.remove(tagOf(hh, ev.Group), m)
			}
		case events.AllBlocksCleared:
			h.clear(mediaMask)
		}
	}
	return true
}
