package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// fdReplyTimeout bounds writing one side-channel answer.
const fdReplyTimeout = 5 * time.Second

// maxFDConns bounds concurrent side-channel exchanges. Each is a
// goroutine, a descriptor and a 1 KiB buffer; beyond the bound new
// connections are refused at once rather than queued behind idle ones.
const maxFDConns = 256

// maxFDRequest bounds a side-channel request line.
const maxFDRequest = 1024

// arenaTicketTTL and maxArenaTickets bound the side channel's tickets: a
// worker redeems its ticket right after the call that returned it, and a
// caller that never redeems its tickets costs at most the bound.
const (
	arenaTicketTTL  = 10 * time.Second
	maxArenaTickets = 4096
)

// arenaTicket returns a ticket for namespace ns's arena ("" when the daemon
// has no tokens: its side channel needs none).
func (s *Server) arenaTicket(ns string) (string, error) {
	if s.tickets == nil {
		return "", nil
	}
	return s.tickets.Issue(ns)
}

// arenaRequest is a side-channel request: a line holding a namespace name,
// or a JSON object with the name and a ticket (a line starting with "{").
type arenaRequest struct {
	Namespace string `json:"namespace"`
	Ticket    string `json:"ticket"`
}

func parseArenaRequest(line string) (arenaRequest, error) {
	line = strings.TrimSuffix(line, "\n")
	if !strings.HasPrefix(line, "{") {
		return arenaRequest{Namespace: line}, nil
	}
	var r arenaRequest
	d := json.NewDecoder(strings.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		return arenaRequest{}, fmt.Errorf("want {\"namespace\": ..., \"ticket\": ...}: %w", err)
	}
	return r, nil
}

// arenaReply is the JSON part of a side-channel answer.
type arenaReply struct {
	Namespace string `json:"namespace"`
	SlotSize  int    `json:"slot_size,omitempty"`
	NumSlots  int    `json:"num_slots,omitempty"`
	Size      int64  `json:"size,omitempty"`
	Kind      string `json:"kind,omitempty"`
	// Epoch is the namespace's (EngineAttachResponse.epoch): the arena
	// whose descriptor this is.
	Epoch uint64 `json:"epoch,omitempty"`
	Error string `json:"error,omitempty"`
}

// serveFDs answers arena descriptor requests on the side channel (see the
// package documentation) until ln is closed. Every connection is answered
// on a goroutine of its own, so idle connections delay no one: each has
// Limits.SideChannelTimeout (2s) to send its line, and past maxFDConns
// exchanges in flight a new connection is refused at once (counted).
func (s *Server) serveFDs(ln *net.UnixListener) error {
	var active atomic.Int32
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return err
		}
		if active.Add(1) > maxFDConns {
			active.Add(-1)
			s.sideRefused.Add(1)
			s.refuseFD(c)
			continue
		}
		s.fdWG.Add(1)
		go func() {
			defer s.fdWG.Done()
			defer active.Add(-1)
			defer c.Close()
			if err := s.answerFD(c); err != nil {
				s.sideLogs.Warn(s.log, "side", "arena side channel", "err", err)
			}
		}()
	}
}

// refuseFD tells a connection past maxFDConns why it gets no descriptor,
// without waiting on it, and closes it.
func (s *Server) refuseFD(c *net.UnixConn) {
	msg, _ := json.Marshal(arenaReply{Error: fmt.Sprintf("%v: %d arena side-channel exchanges in flight; try again", ErrLimit, maxFDConns)})
	// Neither call waits (the socket is non-blocking; a deadline in the
	// past would skip them): a fresh socket's buffer takes the answer, and
	// the request line already sent is read, since a Unix socket closed
	// with unread data resets its peer, which would lose the answer.
	if rc, err := c.SyscallConn(); err == nil {
		rc.Write(func(fd uintptr) bool { unix.Write(int(fd), msg); return true })
		rc.Read(func(fd uintptr) bool { unix.Read(int(fd), make([]byte, maxFDRequest)); return true })
	}
	c.Close()
	s.sideLogs.Warn(s.log, "side-busy", "arena side channel connection refused: too many in flight", "limit", maxFDConns)
}

func (s *Server) answerFD(c *net.UnixConn) error {
	// The client sends its line as soon as it connects; one that sends
	// nothing holds a goroutine until the timeout, never another client.
	c.SetReadDeadline(time.Now().Add(s.limits.SideChannelTimeout))
	// A namespace name is short; never buffer more than a line's worth.
	line, err := bufio.NewReaderSize(io.LimitReader(c, maxFDRequest), maxFDRequest).ReadString('\n')
	c.SetWriteDeadline(time.Now().Add(fdReplyTimeout))
	if err != nil {
		msg, _ := json.Marshal(arenaReply{Error: fmt.Sprintf("want a namespace name and a newline within %d bytes and %v", maxFDRequest, s.limits.SideChannelTimeout)})
		c.Write(msg)
		return fmt.Errorf("read namespace: %w", err)
	}
	reply, rights := s.arenaFor(line)
	payload, err := json.Marshal(reply)
	if err != nil {
		return err
	}
	if _, _, err := c.WriteMsgUnix(payload, rights, nil); err != nil {
		return fmt.Errorf("send arena descriptor: %w", err)
	}
	if reply.Error != "" {
		return errors.New(reply.Error)
	}
	return nil
}

// arenaFor answers side-channel request line: the arena's description and
// its descriptor as SCM_RIGHTS, or why not.
func (s *Server) arenaFor(line string) (arenaReply, []byte) {
	req, err := parseArenaRequest(line)
	if err != nil {
		return arenaReply{Error: err.Error()}, nil
	}
	reply := arenaReply{Namespace: req.Namespace}
	if s.tickets != nil {
		if req.Ticket == "" {
			s.metrics.authRefusals.WithLabelValues("arena", "ticket").Inc()
			reply.Error = fmt.Sprintf("%v: this daemon has tokens; send {\"namespace\": ..., \"ticket\": ...} with the ticket of an authenticated GetArena or EngineAttach", ErrPermissionDenied)
			return reply, nil
		}
		// Spent whatever the outcome. The answer does not say why a
		// ticket failed, nor whether the namespace exists; the log does.
		if err := s.tickets.Redeem(req.Ticket, req.Namespace); err != nil {
			s.metrics.authRefusals.WithLabelValues("arena", "ticket").Inc()
			s.sideLogs.Warn(s.log, "side-ticket", "arena side channel: ticket refused", "namespace", req.Namespace, "why", err)
			reply.Error = fmt.Sprintf("%v: the ticket does not open namespace %q's arena (a ticket opens one namespace once, within %v)", ErrPermissionDenied, req.Namespace, arenaTicketTTL)
			return reply, nil
		}
	}
	ns, ok := s.Namespace(req.Namespace)
	if !ok {
		reply.Error = fmt.Sprintf("%v %q", ErrUnknownNamespace, req.Namespace)
		return reply, nil
	}
	a := ns.Arena()
	reply.Kind, reply.SlotSize, reply.NumSlots, reply.Epoch = a.Kind, a.SlotSize, a.NumSlots, a.Epoch
	reply.Size = int64(a.SlotSize) * int64(a.NumSlots)
	if a.file == nil {
		reply.Error = fmt.Sprintf("%v: namespace %q has a %s arena; configure primary.arena kind file or memfd, or use PutBlocks/GetBlocks", ErrArenaNotShared, req.Namespace, a.Kind)
		return reply, nil
	}
	return reply, unix.UnixRights(int(a.file.Fd()))
}
