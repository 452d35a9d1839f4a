package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/offload"
)

// ErrArenaNotShared reports a daemon whose arena is private memory; use
// PutBlocks/GetBlocks instead.
var ErrArenaNotShared = errors.New("kvtier client: the daemon's arena is not shareable (anonymous memory)")

// Arena is the daemon's slot memory mapped into this process. Slot i is
// shared with the daemon's tier workers: write only the slots PrepareStore
// returned (until CompleteStore) and read only the slots PrepareLoad
// returned (until CompleteLoad).
type Arena struct {
	mem      []byte
	slotSize int
	numSlots int
}

var _ offload.Arena = (*Arena)(nil)

// SlotSize returns the bytes per slot.
func (a *Arena) SlotSize() int { return a.slotSize }

// NumSlots returns the number of slots.
func (a *Arena) NumSlots() int { return a.numSlots }

// Slot returns a view of slot i (no copy).
func (a *Arena) Slot(i int64) ([]byte, error) {
	if a.mem == nil {
		return nil, errors.New("kvtier client: arena unmapped")
	}
	if i < 0 || i >= int64(a.numSlots) {
		return nil, fmt.Errorf("kvtier client: slot %d of %d: %w", i, a.numSlots, offload.ErrSlotOutOfRange)
	}
	off := int(i) * a.slotSize
	return a.mem[off : off+a.slotSize : off+a.slotSize], nil
}

// Close unmaps the arena; views from Slot must no longer be used.
func (a *Arena) Close() error {
	if a.mem == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem = nil
	return err
}

// MapArena maps the daemon's arena (same host only). A memfd arena is
// received over the daemon's arena side channel (SCM_RIGHTS); a file arena
// through the side channel too when available, else by opening its path.
func (c *Client) MapArena(ctx context.Context) (*Arena, error) {
	info, err := c.api.GetArena(ctx, &kvtierv1.GetArenaRequest{Namespace: c.ns})
	if err != nil {
		return nil, err
	}
	if info.GetKind() == kvtierv1.ArenaKind_ARENA_KIND_ANONYMOUS || info.GetKind() == kvtierv1.ArenaKind_ARENA_KIND_UNSPECIFIED {
		return nil, ErrArenaNotShared
	}
	size := info.GetSize()
	if size <= 0 || info.GetSlotSize() <= 0 || size != info.GetSlotSize()*info.GetNumSlots() || int64(int(size)) != size {
		return nil, fmt.Errorf("kvtier client: daemon describes an invalid arena (%d slots of %d bytes, %d bytes)", info.GetNumSlots(), info.GetSlotSize(), size)
	}
	var f *os.File
	switch {
	case info.GetFdSocket() != "":
		f, err = ReceiveArenaFD(ctx, info.GetFdSocket(), c.ns, info.GetTicket())
	case info.GetKind() == kvtierv1.ArenaKind_ARENA_KIND_FILE && info.GetPath() != "":
		f, err = os.OpenFile(info.GetPath(), os.O_RDWR, 0)
	default:
		err = errors.New("kvtier client: the daemon offers no way to reach its arena (no Unix socket)")
	}
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping stays valid after the descriptor is closed
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: map arena (%d bytes): %w", size, err)
	}
	return &Arena{mem: mem, slotSize: int(info.GetSlotSize()), numSlots: int(info.GetNumSlots())}, nil
}

// ReceiveArenaFD asks the daemon's arena side channel at path for the
// descriptor of namespace ns's arena, with ticket (from GetArena or
// EngineAttach; "" for a daemon without tokens, which needs none).
func ReceiveArenaFD(ctx context.Context, path, ns, ticket string) (*os.File, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: arena side channel: %w", err)
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	// A daemon that refuses the connection (too many in flight) answers
	// and closes without reading: the send then fails, but the answer,
	// which says why, is there to read.
	line := []byte(ns + "\n")
	if ticket != "" || strings.HasPrefix(ns, "{") {
		req, err := json.Marshal(struct {
			Namespace string `json:"namespace"`
			Ticket    string `json:"ticket,omitempty"`
		}{ns, ticket})
		if err != nil {
			return nil, err
		}
		line = append(req, '\n')
	}
	_, werr := c.Write(line)
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err == nil && n == 0 && werr != nil {
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("kvtier client: arena side channel: %w", errors.Join(err, werr))
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("kvtier client: arena side channel: %w", err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, got...)
			}
		}
	}
	var reply struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(buf[:n], &reply); err != nil || reply.Error != "" || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		if reply.Error != "" {
			return nil, fmt.Errorf("kvtier client: arena side channel: %s", reply.Error)
		}
		return nil, fmt.Errorf("kvtier client: arena side channel: bad reply (%d descriptors, %q)", len(fds), buf[:n])
	}
	return os.NewFile(uintptr(fds[0]), "kvtier-arena"), nil
}
