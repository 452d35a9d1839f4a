package tiering

import (
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
)

func TestDeleteRemovesFromEveryTierWithEvents(t *testing.T) {
	p := newPrimary(t, 8)
	mem, err := memory.New(memory.Config{Name: "mem", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	other := newFake("other", offload.MediumCPU, offload.LocalityRemote, nil) // no Delete
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{mem, other}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(t.Context())
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	keys := keyRange(0, 4)
	out, ok, err := m.PrepareStore(keys, req)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for mem.Len() < 4 { // the cascade to the memory tier lands
		if time.Now().After(deadline) {
			t.Fatalf("the cascade never landed: %d blocks in the memory tier", mem.Len())
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
	m.ScheduleEnd(offload.ScheduleEnd{})
	// K3 is being loaded by the engine: the primary keeps it.
	if _, err := m.PrepareLoad(keys[3:], req); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Pin(keys[:1], time.Hour); err != nil {
		t.Fatal(err)
	}
	m.TakeEvents()
	a, err := m.Delete(t.Context(), keys)
	if err != nil {
		t.Fatal(err)
	}
	if a.Primary != 3 || a.Held != 1 {
		t.Fatalf("primary: %+v", a)
	}
	if a.Tiers[0] != (TierDelete{Name: "mem", Supported: true, Removed: 4}) || a.Tiers[1].Supported {
		t.Fatalf("tiers: %+v", a.Tiers)
	}
	for _, k := range keys {
		if mem.Contains(k) {
			t.Fatalf("%v still in the memory tier", k)
		}
	}
	if _, ok := m.Pinned(keys[0]); ok {
		t.Fatal("a deleted key kept its router pin")
	}
	// One removal event per medium the blocks left.
	removed := map[offload.Medium]int{}
	for _, ev := range m.TakeEvents() {
		if ev.Removed {
			removed[ev.Medium] += len(ev.Keys)
		}
	}
	if removed[offload.MediumCPU] != 3 || removed[offload.MediumStorage] != 4 {
		t.Fatalf("removal events by medium: %v", removed)
	}
}
