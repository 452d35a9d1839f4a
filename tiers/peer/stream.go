package peer

import (
	"context"
	"crypto/tls"
	"sync"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// maxIdleStreams bounds the idle block-stream connections kept per peer.
const maxIdleStreams = 4

// relearnEvery is how often a peer without a usable stream is asked for
// its address again.
const relearnEvery = 10 * time.Second

// stream is one peer's block-stream endpoint and its idle connections.
type stream struct {
	mu      sync.Mutex
	addr    string // "" until learnt, or when the peer has none
	learnt  time.Time
	idle    []*client.Stream
	tlsConf *tls.Config
}

// streamAddr returns the peer's stream address, asking the peer when
// unknown; "" means use the API (GetBlocks).
func (t *Tier) streamAddr(ctx context.Context, p *peer) string {
	s := &p.stream
	s.mu.Lock()
	if s.addr != "" || time.Since(s.learnt) < relearnEvery {
		a := s.addr
		s.mu.Unlock()
		return a
	}
	s.learnt = time.Now()
	s.mu.Unlock()
	a, err := p.c.StreamAddr(ctx, p.cfg.Addr)
	if err != nil || a == "" {
		return ""
	}
	s.mu.Lock()
	s.addr = a
	s.mu.Unlock()
	return a
}

// forgetStream drops a stream that failed; the next loads use the API
// until it is learnt again.
func (p *peer) forgetStream() {
	s := &p.stream
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addr = ""
	s.learnt = time.Now()
	for _, c := range s.idle {
		c.Close()
	}
	s.idle = nil
}

func (t *Tier) getStream(ctx context.Context, p *peer, addr string) (*client.Stream, error) {
	s := &p.stream
	s.mu.Lock()
	if n := len(s.idle); n > 0 {
		c := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.mu.Unlock()
		return c, nil
	}
	conf := s.tlsConf
	s.mu.Unlock()
	return client.DialStream(ctx, addr, client.StreamOptions{Token: p.cfg.Token, Namespace: t.cfg.Namespace, TLS: conf, Timeout: t.cfg.Timeout})
}

func (p *peer) putStream(c *client.Stream) {
	s := &p.stream
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.idle) < maxIdleStreams && s.addr != "" {
		s.idle = append(s.idle, c)
		return
	}
	c.Close()
}

// streamLoad reads job.Keys[idx] over the block stream straight into
// their slots. ok[i] is set for the blocks that arrived whole and
// verified; gone lists the others. A transport error fails the rest.
func (t *Tier) streamLoad(ctx context.Context, p *peer, addr string, job *offload.Job, idx []int, ok []bool) (gone []offload.Key, err error) {
	sc, err := t.getStream(ctx, p, addr)
	if err != nil {
		return nil, err
	}
	keys := make([]offload.Key, len(idx))
	for j, i := range idx {
		keys[j] = job.Keys[i]
	}
	deadline := time.Now().Add(t.cfg.Timeout)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	res, err := sc.Get(keys, func(j int) []byte {
		slot, serr := job.Arena.Slot(job.Slots[idx[j]])
		if serr != nil {
			return nil // a wrong size: skipped, never written
		}
		return slot
	}, deadline)
	if err != nil {
		sc.Close()
	} else {
		p.putStream(sc)
	}
	for j, r := range res {
		switch r {
		case client.StreamLoaded:
			ok[idx[j]] = true
			p.served.Add(1)
		case client.StreamCorrupt:
			p.corrupt.Add(1)
			gone = append(gone, keys[j])
		default:
			gone = append(gone, keys[j])
		}
	}
	return gone, err
}
