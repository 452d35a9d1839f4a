package fs_test

import (
	"bytes"
	"context"
	"io"
	iofs "io/fs"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	fstier "github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

const slotSize = 8192

func key(n int) offload.Key {
	h := make([]byte, 32)
	h[0], h[31] = byte(n), 0x5a
	return offload.MakeKey(h, 0)
}

type stack struct {
	m       *tiering.Manager
	primary *cpu.Primary
	fs      *fstier.Tier
	dir     string
}

func newStack(t *testing.T, slots int, mod func(*fstier.Config)) *stack {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := cpu.New(cpu.Config{SlotSize: slotSize, Capacity: int64(slots * slotSize), Events: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fstier.Config{Name: "disk", RootDir: dir, Locality: "local", Events: true, ReadThreads: 2, WriteThreads: 2,
		Namespace: filemapper.Namespace{ModelName: "m", TokensPerHash: 16}, Logger: logger}
	if mod != nil {
		mod(&cfg)
	}
	tier, err := fstier.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tiering.New(tiering.Config{Primary: p, Tiers: []offload.SecondaryTier{tier}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return &stack{m: m, primary: p, fs: tier, dir: dir}
}

// store writes keys through the manager (GPU → primary), filling each
// slot with bytes derived from the key, and completes the store.
func (s *stack) store(t *testing.T, req *offload.ReqContext, keys ...offload.Key) map[offload.Key][]byte {
	t.Helper()
	out, ok, err := s.m.PrepareStore(keys, req)
	if err != nil || !ok {
		t.Fatalf("PrepareStore: ok=%v err=%v", ok, err)
	}
	data := map[offload.Key][]byte{}
	for i, k := range out.KeysToStore {
		b, err := s.primary.Arena().Slot(out.Slots[i])
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(k[0]), 7))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		data[k] = slices.Clone(b)
	}
	if err := s.m.CompleteStore(keys, req, true); err != nil {
		t.Fatal(err)
	}
	return data
}

// stepUntil runs engine steps until cond holds.
func (s *stack) stepUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached after 10s", what)
		}
		s.m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
}

// Case 77: through the tiering manager, a stored and completed pair of
// keys yields exactly one STORAGE event with those keys.
func TestCase77EventsThroughManager(t *testing.T) {
	s := newStack(t, 8, nil)
	req := offload.Background("r1")
	s.m.OnNewRequest(req)
	keys := []offload.Key{key(1), key(2)}
	s.store(t, req, keys...)
	var storage []offload.Event
	s.stepUntil(t, "STORAGE event", func() bool {
		for _, e := range s.m.TakeEvents() {
			if e.Medium == offload.MediumStorage {
				storage = append(storage, e)
			}
		}
		return len(storage) > 0 && !s.m.HasPendingWork()
	})
	for range 3 { // nothing more arrives
		s.m.ScheduleEnd(offload.ScheduleEnd{})
		for _, e := range s.m.TakeEvents() {
			if e.Medium == offload.MediumStorage {
				storage = append(storage, e)
			}
		}
	}
	if len(storage) != 1 || !slices.Equal(storage[0].Keys, keys) || storage[0].Removed ||
		storage[0].Locality != offload.LocalityLocal || storage[0].Tier != "disk" {
		t.Fatalf("STORAGE events %+v, want one stored event for %v", storage, keys)
	}
}

// A block evicted from the primary is promoted back from disk intact.
func TestPromotionRoundTripThroughManager(t *testing.T) {
	s := newStack(t, 2, nil)
	req := offload.Background("r1")
	s.m.OnNewRequest(req)
	data := s.store(t, req, key(1), key(2))
	s.stepUntil(t, "first cascade", func() bool { return !s.m.HasPendingWork() })
	s.store(t, req, key(3), key(4)) // evicts key 1 and 2 from the primary
	s.stepUntil(t, "second cascade", func() bool { return !s.m.HasPendingWork() })
	s.m.OnRequestFinished(req)

	r2 := offload.Background("r2")
	s.m.OnNewRequest(r2)
	if got := s.m.Lookup(key(1), r2); got != offload.Retry {
		t.Fatalf("first lookup = %v, want RETRY (existence check queued)", got)
	}
	var last offload.LookupResult
	s.stepUntil(t, "promotion", func() bool {
		last = s.m.Lookup(key(1), r2)
		return last == offload.Hit
	})
	slots, err := s.m.PrepareLoad([]offload.Key{key(1)}, r2)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.primary.Arena().Slot(slots[0])
	if !bytes.Equal(b, data[key(1)]) {
		t.Fatal("promoted block differs from the stored one")
	}
	if err := s.m.CompleteLoad([]offload.Key{key(1)}, r2); err != nil {
		t.Fatal(err)
	}
}

// Disk full in the middle of a cascade: the cascade fails, the primary
// keeps serving, no temp file remains and no pin leaks.
func TestDiskFullMidCascadeThroughManager(t *testing.T) {
	in := vfstest.NewInjector(vfs.OS(), nil)
	s := newStack(t, 8, func(c *fstier.Config) { c.FS = in })
	in.SetRule(vfstest.On(vfstest.OpWrite, key(2).HexHash(), vfstest.Fault{Err: syscall.ENOSPC}))
	req := offload.Background("r1")
	s.m.OnNewRequest(req)
	keys := []offload.Key{key(1), key(2), key(3)}
	data := s.store(t, req, keys...)
	s.stepUntil(t, "cascade result", func() bool { return !s.m.HasPendingWork() })

	st := s.m.Stats()
	if st.Tiers[0].CascadesFailed != 1 || st.Tiers[0].CascadesOK != 0 {
		t.Fatalf("tier stats %+v", st.Tiers[0])
	}
	for _, k := range keys {
		if got := s.m.Lookup(k, req); got != offload.Hit {
			t.Fatalf("primary lookup %v = %v, want HIT", k, got)
		}
		if ref, ok := s.primary.RefCount(k); !ok || ref != 0 {
			t.Fatalf("pin leak on %v: ref %d ok %v", k, ref, ok)
		}
	}
	slots, err := s.m.PrepareLoad(keys, req)
	if err != nil {
		t.Fatalf("primary stopped serving: %v", err)
	}
	for i, k := range keys {
		b, _ := s.primary.Arena().Slot(slots[i])
		if !bytes.Equal(b, data[k]) {
			t.Fatalf("primary block %v changed", k)
		}
	}
	if err := s.m.CompleteLoad(keys, req); err != nil {
		t.Fatal(err)
	}
	var tmp []string
	filepath.WalkDir(s.dir, func(p string, d iofs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".tmp") {
			tmp = append(tmp, p)
		}
		return nil
	})
	if len(tmp) != 0 {
		t.Fatalf("temp files remain: %v", tmp)
	}
	for _, e := range s.m.TakeEvents() {
		if e.Medium == offload.MediumStorage {
			t.Fatalf("STORAGE event from a failed cascade: %+v", e)
		}
	}
}
