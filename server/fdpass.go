package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// fdRequestTimeout bounds one side-channel exchange.
const fdRequestTimeout = 5 * time.Second

// maxFDConns bounds concurrent side-channel connections.
const maxFDConns = 16

// maxFDRequest bounds a side-channel request line.
const maxFDRequest = 1024

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
// package documentation) until ln is closed.
func (s *Server) serveFDs(ln *net.UnixListener) error {
	sem := make(chan struct{}, maxFDConns)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return err
		}
		sem <- struct{}{}
		s.fdWG.Add(1)
		go func() {
			defer s.fdWG.Done()
			defer func() { <-sem }()
			defer c.Close()
			if err := s.answerFD(c); err != nil {
				s.sideLogs.Warn(s.log, "side", "arena side channel", "err", err)
			}
		}()
	}
}

func (s *Server) answerFD(c *net.UnixConn) error {
	c.SetDeadline(time.Now().Add(fdRequestTimeout))
	// A namespace name is short; never buffer more than a line's worth.
	line, err := bufio.NewReaderSize(io.LimitReader(c, maxFDRequest), maxFDRequest).ReadString('\n')
	if err != nil {
		msg, _ := json.Marshal(arenaReply{Error: fmt.Sprintf("want a namespace name and a newline within %d bytes", maxFDRequest)})
		c.Write(msg)
		return fmt.Errorf("read namespace: %w", err)
	}
	name := strings.TrimSuffix(line, "\n")
	reply := arenaReply{Namespace: name}
	var rights []byte
	ns, ok := s.Namespace(name)
	switch {
	case !ok:
		reply.Error = fmt.Sprintf("%v %q", ErrUnknownNamespace, name)
	default:
		a := ns.Arena()
		reply.Kind, reply.SlotSize, reply.NumSlots, reply.Epoch = a.Kind, a.SlotSize, a.NumSlots, a.Epoch
		reply.Size = int64(a.SlotSize) * int64(a.NumSlots)
		if a.file == nil {
			reply.Error = fmt.Sprintf("%v: namespace %q has a %s arena; configure primary.arena kind file or memfd, or use PutBlocks/GetBlocks", ErrArenaNotShared, name, a.Kind)
		} else {
			rights = unix.UnixRights(int(a.file.Fd()))
		}
	}
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
