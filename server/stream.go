package server

import (
	"bufio"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

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
// A read answers from the primary alone (kv_load_tiers: [] semantics), so a
// peer read never reaches a secondary tier. Blocks stay pinned while they
// are written; a write stalled past the stream timeout ends the connection
// and unpins them.
//
// A put reserves the slots of the keys the primary lacks (PrepareStore,
// default filters), reads each block from the socket straight into its
// reserved slot and commits only the blocks whose size and checksum
// match; the others, and all of them if the connection fails, are
// abandoned, so a damaged block is never exposed. Keys the primary holds
// already are read and discarded.

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

// pinForStream pins the primary's ready copies of keys and returns their
// slots (-1 where the primary holds no ready copy) and release, which
// unpins them. It never asks a secondary tier.
func (ns *Namespace) pinForStream(keys []offload.Key) (slots []int64, release func(), err error) {
	if err := ns.lock(); err != nil {
		return nil, nil, err
	}
	defer ns.mu.Unlock()
	rc, _, finish, err := ns.callRequestLocked(nil, "", "block stream", []byte(`{"kv_load_tiers":[]}`))
	if err != nil {
		return nil, nil, err
	}
	results := make([]offload.LookupResult, len(keys))
	ns.lookupLocked(rc, keys, results)
	var hits []offload.Key
	var idx []int
	for i, r := range results {
		if r == offload.Hit {
			hits = append(hits, keys[i])
			idx = append(idx, i)
		}
	}
	slots = make([]int64, len(keys))
	for i := range slots {
		slots[i] = -1
	}
	if len(hits) == 0 {
		finish()
		return slots, func() {}, nil
	}
	got, err := ns.mgr.PrepareLoad(hits, rc)
	if err != nil {
		finish()
		return nil, nil, fmt.Errorf("%w: prepare load: %w", ErrProtocol, err)
	}
	for j, s := range got {
		slots[idx[j]] = s
	}
	return slots, func() {
		if ns.lock() != nil {
			return // closed: Close released everything
		}
		defer ns.mu.Unlock()
		_ = ns.mgr.CompleteLoad(hits, rc)
		finish()
	}, nil
}

// serveStream accepts block-stream connections until ln closes.
func (s *Server) serveStream(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		s.streamMu.Lock()
		if s.streamClosed {
			s.streamMu.Unlock()
			c.Close()
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
			}()
			if err := s.streamConn(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("block stream ended", "remote", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

func (s *Server) streamConn(c net.Conn) error {
	if tc, ok := c.(*tls.Conn); ok {
		_ = tc.SetDeadline(time.Now().Add(streamTimeout))
		if err := tc.Handshake(); err != nil {
			return err
		}
	}
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetReadDeadline(time.Now().Add(streamTimeout))
	var hello [5]byte
	if _, err := io.ReadFull(r, hello[:]); err != nil {
		return err
	}
	if string(hello[:4]) != streamMagic || hello[4] != streamVersion {
		return fmt.Errorf("block stream: bad hello %q", hello)
	}
	token, err := blockstream.ReadField(r, maxStreamField)
	if err != nil {
		return err
	}
	nsName, err := blockstream.ReadField(r, maxStreamField)
	if err != nil {
		return err
	}
	refuse := func() error {
		_, _ = c.Write([]byte(streamMagic + "\x01"))
		return errors.New("block stream: refused")
	}
	if s.cfg.AuthToken != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AuthToken)) != 1 {
		return refuse()
	}
	ns, ok := s.Namespace(string(nsName))
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
		n := int(word &^ (putFlag | pushFlag))
		if n <= 0 || n > s.limits.MaxKeysPerCall {
			return fmt.Errorf("block stream: %d keys (1 to %d)", n, s.limits.MaxKeysPerCall)
		}
		_ = c.SetReadDeadline(time.Now().Add(streamTimeout))
		keys := make([]offload.Key, n)
		for i := range keys {
			k, err := blockstream.ReadField(r, maxStreamField)
			if err != nil {
				return err
			}
			keys[i] = offload.Key(k)
			if !keys[i].Valid() || len(k) > s.limits.MaxKeyBytes {
				return fmt.Errorf("block stream: key %d: %w", i, offload.ErrInvalidKey)
			}
		}
		if word&putFlag != 0 {
			err = s.streamPut(c, r, w, ns, keys, word&pushFlag != 0)
		} else {
			err = s.streamBlocks(c, w, ns, keys)
		}
		if err != nil {
			return err
		}
	}
}

// reserveForStream reserves the primary's slots for the keys it lacks and
// returns their slots (-1 for keys it holds or that repeat an earlier
// key) and commit, which completes the stores of the keys ok marks and
// abandons the rest. commit must be called exactly once.
func (ns *Namespace) reserveForStream(keys []offload.Key, push bool) (slots []int64, commit func(ok []bool) error, err error) {
	if err := ns.lock(); err != nil {
		return nil, nil, err
	}
	defer ns.mu.Unlock()
	var params []byte
	if push {
		// A peer's push goes to this primary and its storage tiers: the
		// filter excludes medium CPU, so this daemon's peer tiers (their
		// peers' DRAM) never pass it on.
		params = []byte(pushStoreParams)
	}
	rc, _, finish, err := ns.callRequestLocked(nil, "", "block stream put", params)
	if err != nil {
		return nil, nil, err
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
		return nil, nil, fmt.Errorf("%w: prepare store: %w", ErrProtocol, err)
	}
	if !ok {
		finish()
		return nil, nil, ns.noSpace(len(keys))
	}
	slots = make([]int64, len(keys))
	for i := range slots {
		slots[i] = -1
	}
	at := make(map[offload.Key]int64, len(out.KeysToStore))
	for i, k := range out.KeysToStore {
		at[k] = out.Slots[i]
	}
	for i, k := range keys {
		if s, ok := at[k]; ok {
			slots[i] = s
			delete(at, k) // a repeated key is read once, into the first
		}
	}
	return slots, func(ok []bool) error {
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
func (s *Server) streamPut(c net.Conn, r *bufio.Reader, w *bufio.Writer, ns *Namespace, keys []offload.Key, push bool) error {
	slots, commit, err := ns.reserveForStream(keys, push)
	noRoom := errors.Is(err, ErrNoSpace)
	switch {
	case noRoom:
		// Answer, not hang up: the blocks are read and dropped, each
		// rejected, and the stream stays usable.
		s.log.Debug("block stream put: no room", "keys", len(keys), "err", err)
		slots = make([]int64, len(keys))
		for i := range slots {
			slots[i] = -1
		}
		commit = func([]bool) error { return nil }
	case err != nil:
		return err
	}
	ok := make([]bool, len(keys))
	committed := false
	defer func() {
		if !committed {
			_ = commit(make([]bool, len(keys))) // abandon every reservation
		}
	}()
	status := make([]byte, len(keys))
	slotSize := ns.arena.SlotSize()
	var h blockstream.Summer
	for i := range keys {
		// Each block gets the stream timeout, not the whole request.
		_ = c.SetReadDeadline(time.Now().Add(streamTimeout))
		n, err := blockstream.ReadLen(r, &h)
		if err != nil {
			return err
		}
		if slots[i] < 0 || n != int64(slotSize) {
			status[i] = putPresent
			if noRoom || n != int64(slotSize) {
				status[i] = putRejected
			}
			if err := blockstream.Skip(r, n); err != nil {
				return err
			}
			continue
		}
		dst, err := ns.arena.Slot(slots[i])
		if err != nil {
			return err
		}
		// Straight from the socket into the reserved slot.
		whole, err := blockstream.ReadBody(r, dst, &h)
		if err != nil {
			return fmt.Errorf("block stream: put block %d: %w", i, err)
		}
		if !whole {
			status[i] = putRejected
			continue
		}
		ok[i] = true
		status[i] = putStored
	}
	committed = true
	if err := commit(ok); err != nil {
		return err
	}
	_ = c.SetWriteDeadline(time.Now().Add(streamTimeout))
	if _, err := w.Write(status); err != nil {
		return err
	}
	return w.Flush()
}

// streamBlocks answers one request: pins, writes each block from its slot
// with its checksum, unpins.
func (s *Server) streamBlocks(c net.Conn, w *bufio.Writer, ns *Namespace, keys []offload.Key) error {
	slots, release, err := ns.pinForStream(keys)
	if err != nil {
		return err
	}
	defer release()
	var h blockstream.Summer
	for i, slot := range slots {
		// Each block gets the stream timeout, not the whole request.
		_ = c.SetWriteDeadline(time.Now().Add(streamTimeout))
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
		if err := w.WriteByte(1); err != nil {
			return err
		}
		// Straight from the pinned slot into the socket.
		if err := blockstream.WriteBlock(w, data, &h); err != nil {
			return fmt.Errorf("block stream: block %d: %w", i, err)
		}
	}
	return w.Flush()
}
