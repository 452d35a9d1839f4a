package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"

	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/offload"
)

// The block stream is a plain TCP connection that moves blocks between a
// daemon's primary and a peer or remote engine without the API's copies:
// the server writes each block from its pinned slot straight into the
// socket, the client reads it straight into the destination slot and
// checks its checksum before it reports the block loaded; puts go the
// other way into reserved slots. A peer learns the stream's address from
// Stats (stream_addr); it is not configured by hand. Package blockstream
// has the protocol.
//
// A plain read (a peer tier's) answers from the primary alone
// (kv_load_tiers: [] semantics), so a peer read never reaches a secondary
// tier. A read with parameters (a remote engine's GetBlocks) is the API's
// GetBlocks with its filters and wait, its blocks streamed. Blocks stay
// pinned while they are written; a write stalled past the stream timeout
// ends the connection and unpins them.
//
// A put reserves the slots of the keys the primary lacks (PrepareStore,
// with the put's parameters or default filters), reads each block from the
// socket straight into its reserved slot and commits only the blocks whose
// size and checksum match; the others, and all of them if the connection
// fails, are abandoned, so a damaged block is never exposed. Keys the
// primary holds already are read and discarded.

// pushStoreParams are the filters of a peer's push (see reserveForStream).
const pushStoreParams = `{"kv_store_tiers":[{"medium":"storage"}]}`

const (
	streamMagic   = blockstream.Magic
	streamVersion = blockstream.Version
	putFlag       = blockstream.PutFlag
	pushFlag      = blockstream.PushFlag
	putStored     = blockstream.PutStored
	putPresent    = blockstream.PutPresent
	putRejected   = blockstream.PutRejected
	// streamTimeout bounds one request's reads and writes.
	streamTimeout = 30 * time.Second
	// maxStreamField bounds the token and namespace of a hello.
	maxStreamField = 4096
)

// serveStream accepts block-stream connections until ln closes, at most
// limit open at once: like netutil.LimitListener it stops accepting at
// the limit, but it hands each connection over as the listener made it,
// so that a reply's blocks go out in one writev each (net.Buffers writes
// a wrapped connection one buffer at a time).
func (s *Server) serveStream(ln net.Listener, limit int) error {
	sem := make(chan struct{}, max(limit, 1))
	for {
		sem <- struct{}{} // released when a connection ends; Close ends them all
		c, err := ln.Accept()
		if err != nil {
			<-sem
			return err
		}
		s.streamMu.Lock()
		if s.streamClosed {
			s.streamMu.Unlock()
			c.Close()
			<-sem
			continue
		}
		s.streamConns[c] = struct{}{}
		s.streamMu.Unlock()
		s.streamWG.Add(1)
		go func() {
			defer s.streamWG.Done()
			defer func() {
				s.streamMu.Lock()
				delete(s.streamConns, c)
				s.streamMu.Unlock()
				c.Close()
				<-sem
			}()
			if err := s.streamConn(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("block stream ended", "remote", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

func (s *Server) streamConn(c net.Conn) error {
	// A stranger holds a connection for auth_timeout at most: the TLS
	// handshake and the hello with its token come within it.
	hello := streamTimeout
	if s.limits.AuthTimeout > 0 {
		hello = s.limits.AuthTimeout
	}
	helloBy := time.Now().Add(hello)
	timedOut := func(err error) error {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			s.metrics.authRefusals.WithLabelValues("stream", "timeout").Inc()
			s.sideLogs.Warn(s.log, "stream-hello", "block stream connection closed: no hello within server.auth_timeout", "auth_timeout", hello)
		}
		return err
	}
	if tc, ok := c.(*tls.Conn); ok {
		_ = tc.SetDeadline(helloBy)
		if err := tc.Handshake(); err != nil {
			return timedOut(err)
		}
	}
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetReadDeadline(helloBy)
	var magic [5]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return timedOut(err)
	}
	if string(magic[:4]) != streamMagic || magic[4] != streamVersion {
		return fmt.Errorf("block stream: bad hello %q", magic)
	}
	token, err := blockstream.ReadField(r, maxStreamField)
	if err != nil {
		return timedOut(err)
	}
	nsName, err := blockstream.ReadField(r, maxStreamField)
	if err != nil {
		return timedOut(err)
	}
	refuse := func() error {
		_, _ = c.Write([]byte(streamMagic + "\x01"))
		return errors.New("block stream: refused")
	}
	from := caller{}
	if tc, ok := c.(*tls.Conn); ok {
		from.certCN = verifiedCN(tc.ConnectionState())
	}
	p, err := s.tenancy.authenticate(string(token), len(token) > 0, from)
	if err != nil {
		s.metrics.authRefusals.WithLabelValues("stream", "token").Inc()
		return refuse()
	}
	name, sc, err := s.tenancy.resolve(p, string(nsName))
	if err != nil {
		return refuse()
	}
	ns, ok := s.Namespace(name)
	if !ok {
		return refuse()
	}
	if _, err := c.Write([]byte(streamMagic + "\x00")); err != nil {
		return err
	}
	w := bufio.NewWriterSize(c, 64<<10)
	for {
		// Idle between requests like any connection.
		_ = c.SetReadDeadline(time.Now().Add(s.limits.ConnectionIdleTimeout))
		var nb [4]byte
		if _, err := io.ReadFull(r, nb[:]); err != nil {
			return err
		}
		word := binary.BigEndian.Uint32(nb[:])
		n := int(word &^ blockstream.Flags)
		if n <= 0 || n > s.limits.MaxKeysPerCall {
			return fmt.Errorf("block stream: %d keys (1 to %d)", n, s.limits.MaxKeysPerCall)
		}
		if word&pushFlag != 0 && word&(putFlag|blockstream.ParamsFlag) != putFlag {
			return errors.New("block stream: a push is a put without parameters")
		}
		if word&blockstream.MetaFlag != 0 && word&(putFlag|blockstream.ParamsFlag|pushFlag) != putFlag|blockstream.ParamsFlag {
			return errors.New("block stream: metadata comes with a by-value put only")
		}
		_ = c.SetReadDeadline(time.Now().Add(streamTimeout))
		keys := make([]offload.Key, n)
		for i := range keys {
			k, err := blockstream.ReadField(r, maxStreamField)
			if err != nil {
				return err
			}
			keys[i] = sc.keys.Key(k)
			if !keys[i].Valid() || len(k) > s.limits.MaxKeyBytes {
				return fmt.Errorf("block stream: key %d: %w", i, offload.ErrInvalidKey)
			}
		}
		var o *streamOpts
		if word&blockstream.ParamsFlag != 0 {
			if o, err = s.readStreamOpts(r, word&putFlag == 0); err != nil {
				return err
			}
		}
		if word&blockstream.MetaFlag != 0 {
			if o.metas, err = s.readStreamMetas(r, n); err != nil {
				return err
			}
		}
		if word&putFlag != 0 {
			err = s.streamPut(c, r, w, ns, sc, keys, word&pushFlag != 0, o)
		} else {
			err = s.streamBlocks(c, w, ns, sc, keys, o)
		}
		s.countStream(word, err)
		if err != nil && !errors.Is(err, errAnswered) {
			return err
		}
	}
}

// requestDeadline is when a block-stream request that moves n bytes and
// began at start must be done (Limits.StreamRequestTimeout and
// StreamMinRate).
func (s *Server) requestDeadline(start time.Time, n int64) time.Time {
	return start.Add(s.limits.StreamRequestTimeout + time.Duration(float64(n)/float64(s.limits.StreamMinRate)*float64(time.Second)))
}

// blockDeadline is the deadline of the next block of a request due by
// end: the stream timeout, but never past the request's own deadline.
func blockDeadline(end time.Time) time.Time {
	if d := time.Now().Add(streamTimeout); d.Before(end) {
		return d
	}
	return end
}

// errAnswered is what streamPut and streamBlocks return, after answering
// the call with its error, for countStream: the connection goes on.
var errAnswered = errors.New("answered with an error")

// countStream counts a request of key-count word that ended with err.
func (s *Server) countStream(word uint32, err error) {
	var kind string
	switch {
	case word&pushFlag != 0:
		kind = "push"
	case word&putFlag != 0 && word&blockstream.ParamsFlag != 0:
		kind = "put_blocks"
	case word&putFlag != 0:
		kind = "put"
	case word&blockstream.ParamsFlag != 0:
		kind = "get_blocks"
	default:
		kind = "get"
	}
	result := "ok"
	if err != nil {
		result = "failed"
	}
	s.metrics.streamCalls.WithLabelValues(kind, result).Inc()
}

// streamOpts are the parameters of a remote engine's by-value call.
type streamOpts struct {
	params     []byte
	wait       time.Duration
	prefixOnly bool
	metas      []BlockMeta // a put's token metadata (MetaFlag)
}

// readStreamOpts reads the parameters that follow the keys of a request
// with ParamsFlag (with get, those of a get).
func (s *Server) readStreamOpts(r *bufio.Reader, get bool) (*streamOpts, error) {
	params, err := blockstream.ReadField(r, min(s.limits.MaxParamsBytes, 1<<16-1))
	if err != nil {
		return nil, fmt.Errorf("block stream: parameters: %w", err)
	}
	o := &streamOpts{params: params}
	if len(params) == 0 {
		o.params = nil
	}
	if !get {
		return o, nil
	}
	ms, err := blockstream.ReadU32(r)
	if err != nil {
		return nil, err
	}
	prefix, err := r.ReadByte()
	if err != nil {
		return nil, err
	}
	if prefix > 1 {
		return nil, fmt.Errorf("block stream: prefix-only byte %d", prefix)
	}
	o.wait, o.prefixOnly = time.Duration(ms)*time.Millisecond, prefix == 1
	return o, nil
}

// readStreamMetas reads the token metadata of a put's n blocks
// (MetaFlag), each at most blockstream.MaxMeta bytes and all together at
// most a message's bound.
func (s *Server) readStreamMetas(r *bufio.Reader, n int) ([]BlockMeta, error) {
	metas := make([]BlockMeta, n)
	total := 0
	var buf []byte
	for i := range metas {
		size, err := blockstream.ReadU32(r)
		if err != nil {
			return nil, err
		}
		total += int(size)
		if size > blockstream.MaxMeta || total > s.limits.MaxMessageBytes {
			return nil, fmt.Errorf("block stream: metadata of block %d: %d bytes (at most %d, %d in a call)", i, size, blockstream.MaxMeta, s.limits.MaxMessageBytes)
		}
		if size == 0 {
			continue
		}
		buf = slices.Grow(buf[:0], int(size))[:size]
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		var m kvtierv1.BlockMetadata
		if err := proto.Unmarshal(buf, &m); err != nil {
			return nil, fmt.Errorf("block stream: metadata of block %d: %w", i, err)
		}
		metas[i] = metaFromProto(&m)
	}
	return metas, nil
}

// reserveForStream reserves the primary's slots for the keys it lacks and
// returns their slots (-1 for keys it holds or that repeat an earlier
// key) and commit, which completes the stores of the keys ok marks and
// abandons the rest. commit must be called exactly once.
func (ns *Namespace) reserveForStream(keys []offload.Key, push bool, params []byte, metas []BlockMeta) (slots []int64, gens []uint16, commit func(ok []bool) error, err error) {
	if err := ns.checkParams(params); err != nil {
		return nil, nil, nil, err
	}
	if err := ns.lock(); err != nil {
		return nil, nil, nil, err
	}
	defer ns.mu.Unlock()
	if push {
		// A peer's push goes to this primary and its storage tiers: the
		// filter excludes medium CPU, so this daemon's peer tiers (their
		// peers' DRAM) never pass it on.
		params = []byte(pushStoreParams)
	}
	rc, _, finish, err := ns.callRequestLocked(nil, "", "block stream put", params)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ns.recordMetasLocked(keys, metas); err != nil {
		finish()
		return nil, nil, nil, err
	}
	uniq := make([]offload.Key, 0, len(keys))
	seen := make(map[offload.Key]bool, len(keys))
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			uniq = append(uniq, k)
		}
	}
	out, ok, err := ns.mgr.PrepareStore(uniq, rc)
	if err != nil {
		finish()
		return nil, nil, nil, fmt.Errorf("%w: prepare store: %w", ErrProtocol, err)
	}
	if !ok {
		finish()
		return nil, nil, nil, ns.noSpace(len(keys))
	}
	slots = make([]int64, len(keys))
	gens = make([]uint16, len(keys))
	for i := range slots {
		slots[i] = -1
	}
	at := make(map[offload.Key]int64, len(out.KeysToStore))
	for i, k := range out.KeysToStore {
		at[k] = out.Slots[i]
	}
	for i, k := range keys {
		if s, ok := at[k]; ok {
			slots[i], gens[i] = s, ns.mgr.SlotGen(s)
			delete(at, k) // a repeated key is read once, into the first
		}
	}
	return slots, gens, func(ok []bool) error {
		if err := ns.lock(); err != nil {
			return err // closed: Close released everything
		}
		defer ns.mu.Unlock()
		defer finish()
		var good, bad []offload.Key
		for i, s := range slots {
			if s < 0 {
				continue
			}
			if ok[i] {
				good = append(good, keys[i])
			} else {
				bad = append(bad, keys[i])
			}
		}
		var err error
		if len(bad) > 0 {
			err = ns.mgr.CompleteStore(bad, rc, false)
		}
		if len(good) > 0 {
			err = errors.Join(err, ns.mgr.CompleteStore(good, rc, true))
		}
		ns.publishLocked()
		return err
	}, nil
}

// streamPut answers one put request: reserves, reads each block into its
// slot, commits the verified ones, answers a status per key.
func (s *Server) streamPut(c net.Conn, r *bufio.Reader, w *bufio.Writer, ns *Namespace, sc scope, keys []offload.Key, push bool, o *streamOpts) error {
	var params []byte
	var metas []BlockMeta
	if o != nil {
		params, metas = o.params, o.metas
	}
	slots, gens, commit, err := ns.reserveForStream(keys, push, params, metas)
	if err == nil {
		var release func()
		if release, err = s.hold(ns, sc, reserved(slots)); err != nil {
			_ = commit(make([]bool, len(keys))) // abandon every reservation
		} else {
			defer release()
		}
	}
	var failed error
	switch {
	case err == nil:
	case errors.Is(err, ErrNoSpace) || o != nil:
		// Answer, not hang up: the blocks are read and dropped, each
		// rejected (with o: the call answered with err), and the stream
		// stays usable.
		s.log.Debug("block stream put refused", "keys", len(keys), "err", err)
		failed = err
		_ = sc.refused(err)
		slots, gens = make([]int64, len(keys)), make([]uint16, len(keys))
		for i := range slots {
			slots[i] = -1
		}
		commit = func([]bool) error { return nil }
	default:
		return err
	}
	ok := make([]bool, len(keys))
	committed := false
	defer func() {
		if !committed {
			_ = commit(make([]bool, len(keys))) // abandon every reservation
		}
	}()
	status, err := s.readPutBlocks(c, r, ns, slots, gens, failed != nil, ok)
	if err != nil {
		return err
	}
	committed = true
	if err := commit(ok); err != nil {
		return err
	}
	sc.countStored(ok)
	_ = c.SetWriteDeadline(time.Now().Add(streamTimeout))
	if failed != nil && o != nil {
		return writeFailed(w, failed)
	}
	if o != nil {
		if err := w.WriteByte(blockstream.ReplyDone); err != nil {
			return err
		}
	}
	if _, err := w.Write(status); err != nil {
		return err
	}
	return w.Flush()
}

// readPutBlocks reads the blocks of a put, each straight from the socket
// into its reserved slot, verified there, and returns a status per block
// (ok[i] set for the stored ones). A block without a slot (present
// already, or every block when refused) or of the wrong size is read and
// dropped.
func (s *Server) readPutBlocks(c net.Conn, r *bufio.Reader, ns *Namespace, slots []int64, gens []uint16, refused bool, ok []bool) ([]byte, error) {
	status := make([]byte, len(slots))
	slotSize := ns.arena.SlotSize()
	end := s.requestDeadline(time.Now(), int64(len(slots))*int64(slotSize))
	var h blockstream.Summer
	for i := range slots {
		// Each block gets the stream timeout, and the whole request its
		// own deadline: a trickle cannot hold the reserved slots for long.
		_ = c.SetReadDeadline(blockDeadline(end))
		n, err := blockstream.ReadLen(r, &h)
		if err != nil {
			return nil, err
		}
		if slots[i] < 0 || n != int64(slotSize) {
			switch {
			case n != int64(slotSize):
				s.metrics.streamRejected.Inc()
				status[i] = putRejected
			case refused:
				status[i] = putRejected
			default:
				status[i] = putPresent
			}
			if err := blockstream.Skip(r, n); err != nil {
				return nil, err
			}
			continue
		}
		dst, err := ns.arena.Slot(slots[i])
		if err != nil {
			return nil, err
		}
		// Straight from the socket into the reserved slot.
		whole, err := blockstream.ReadBody(r, dst, &h)
		if err != nil {
			return nil, fmt.Errorf("block stream: put block %d: %w", i, err)
		}
		if !whole {
			s.metrics.streamRejected.Inc()
			status[i] = putRejected
			continue
		}
		s.metrics.streamIn.Inc()
		ok[i] = true
		status[i] = putStored
		// Verified: what the block's gets send as its sum.
		ns.sums.put(slots[i], gens[i], h.Sum64())
	}
	return status, nil
}

// peerReadParams make a plain stream read (a peer tier's) answer from
// the primary alone.
var peerReadParams = []byte(`{"kv_load_tiers":[]}`)

// streamBlocks answers one get: looks the keys up and pins the blocks to
// return (pinGetLocked: with o, as GetBlocks; without, from the primary
// alone), writes each from its slot with its checksum, unpins.
func (s *Server) streamBlocks(c net.Conn, w *bufio.Writer, ns *Namespace, sc scope, keys []offload.Key, o *streamOpts) error {
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	defer cancel()
	params, wait, prefixOnly := peerReadParams, time.Duration(0), false
	var err error
	if o != nil {
		params, wait, prefixOnly = o.params, o.wait, o.prefixOnly
		err = ns.checkGetSize(len(keys))
	}
	var g *pinnedGet
	if err == nil {
		g, err = ns.pinGetLocked(ctx, nil, "", params, keys, wait, prefixOnly)
	}
	if err != nil {
		if o != nil && !errors.Is(err, ErrClosed) {
			_ = c.SetWriteDeadline(time.Now().Add(streamTimeout))
			return writeFailed(w, err)
		}
		return err
	}
	sc.countLookups(g.results)
	release, err := s.hold(ns, sc, reserved(g.slots))
	if err != nil {
		_ = g.doneLocked()
		ns.mu.Unlock()
		_ = sc.refused(err)
		if o != nil {
			_ = c.SetWriteDeadline(time.Now().Add(streamTimeout))
			return writeFailed(w, err)
		}
		return err
	}
	defer release()
	// The pinned blocks' generations: their checksums may be known.
	gens := make([]uint16, len(g.slots))
	for i, slot := range g.slots {
		if slot >= 0 {
			gens[i] = ns.mgr.SlotGen(slot)
		}
	}
	ns.mu.Unlock()
	defer func() {
		if ns.lock() != nil {
			return // closed: Close released everything
		}
		defer ns.mu.Unlock()
		_ = g.doneLocked()
	}()
	_ = c.SetWriteDeadline(time.Now().Add(streamTimeout))
	if o != nil {
		if err := w.WriteByte(blockstream.ReplyDone); err != nil {
			return err
		}
		if err := blockstream.WriteU32(w, uint32(g.hits)); err != nil {
			return err
		}
		for _, r := range g.results {
			if err := w.WriteByte(byte(resultProto(r))); err != nil {
				return err
			}
		}
	}
	sent := 0
	for _, slot := range g.slots {
		if slot >= 0 {
			sent++
		}
	}
	end := s.requestDeadline(time.Now(), int64(sent)*int64(ns.arena.SlotSize()))
	var h blockstream.Summer
	for i, slot := range g.slots {
		// Each block gets the stream timeout, and the whole request its
		// own deadline: a slow reader cannot hold the pinned slots for
		// long.
		_ = c.SetWriteDeadline(blockDeadline(end))
		if slot < 0 {
			if err := w.WriteByte(0); err != nil {
				return err
			}
			continue
		}
		data, err := ns.arena.Slot(slot)
		if err != nil {
			return err
		}
		// Straight from the pinned slot into the socket: a block whose sum
		// is known in one vectored write with its framing, nothing hashed
		// or copied in user space; another hashed on the way.
		if sum, ok := ns.sums.get(slot, gens[i]); ok {
			err = blockstream.WriteBlockSummed(w, c, data, sum)
		} else if err = w.WriteByte(1); err == nil {
			if err = blockstream.WriteBlock(w, data, &h); err == nil {
				ns.sums.put(slot, gens[i], h.Sum64())
			}
		}
		if err != nil {
			return fmt.Errorf("block stream: block %d: %w", i, err)
		}
		s.metrics.streamOut.Inc()
	}
	return w.Flush()
}

// reserved counts the slots of a request that hold a block (not -1).
func reserved(slots []int64) int {
	n := 0
	for _, s := range slots {
		if s >= 0 {
			n++
		}
	}
	return n
}

// writeFailed answers a call with parameters that failed with err, as the
// API would (its status code and message); the stream stays usable.
func writeFailed(w *bufio.Writer, err error) error {
	st := status.Convert(toStatus(err))
	msg := st.Message()
	if len(msg) > maxStreamField {
		msg = msg[:maxStreamField]
	}
	if err := w.WriteByte(blockstream.ReplyFailed); err != nil {
		return err
	}
	if err := w.WriteByte(byte(st.Code())); err != nil {
		return err
	}
	if err := blockstream.WriteField(w, []byte(msg)); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return errAnswered
}
