package remote

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

func key(i int) offload.Key {
	return offload.MakeKey([]byte{0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)}, 0)
}

func removedKeys(evs []offload.Event) []offload.Key {
	var out []offload.Key
	for _, ev := range evs {
		if ev.Removed {
			out = append(out, ev.Keys...)
		}
	}
	return out
}

// Removals are published for announced keys only, once.
func TestEventsPublishRemovalsOfAnnouncedKeysOnce(t *testing.T) {
	e := NewEvents("t", offload.MediumCPU, offload.LocalityRemote, 0)
	e.Stored([]offload.Key{key(1), key(2)})
	e.Removed([]offload.Key{key(2), key(3)}) // 3 was never announced
	e.Removed([]offload.Key{key(2)})         // already removed
	evs := e.Take()
	if got := removedKeys(evs); !slices.Equal(got, []offload.Key{key(2)}) {
		t.Fatalf("removed %v, want only key 2", got)
	}
	if e.Announced() != 1 {
		t.Fatalf("announced %d, want 1", e.Announced())
	}
}

// The reconciler publishes the removal of every announced key the server
// no longer holds, leaves present ones, publishes nothing when a check
// fails, and leaves a key announced again during the pass alone.
func TestReconcile(t *testing.T) {
	e := NewEvents("t", offload.MediumStorage, offload.LocalityLocal, 0)
	var keys []offload.Key
	for i := range 10 {
		keys = append(keys, key(i))
	}
	e.Stored(keys)
	e.Take()
	server := map[offload.Key]bool{}
	for _, k := range keys[:6] {
		server[k] = true
	}
	var mu sync.Mutex
	check := func(_ context.Context, ks []offload.Key) ([]bool, error) {
		mu.Lock()
		defer mu.Unlock()
		out := make([]bool, len(ks))
		for i, k := range ks {
			out[i] = server[k]
		}
		return out, nil
	}
	failing := func(context.Context, []offload.Key) ([]bool, error) { return nil, errors.New("down") }
	if _, removed, err := e.Reconcile(t.Context(), failing, ReconcileOptions{Batch: 3}); err == nil || removed != 0 || len(e.Take()) != 0 {
		t.Fatalf("failed check: removed %d, err %v; want nothing published", removed, err)
	}
	checked, removed, err := e.Reconcile(t.Context(), check, ReconcileOptions{Batch: 3, Rate: 1 << 20})
	if err != nil || checked != 10 || removed != 4 {
		t.Fatalf("checked %d removed %d err %v; want 10, 4, nil", checked, removed, err)
	}
	got := removedKeys(e.Take())
	slices.Sort(got)
	if !slices.Equal(got, keys[6:]) {
		t.Fatalf("removed %v, want %v", got, keys[6:])
	}
	// Announced = present now: a second pass finds nothing.
	if _, removed, _ := e.Reconcile(t.Context(), check, ReconcileOptions{}); removed != 0 || e.Announced() != 6 {
		t.Fatalf("second pass removed %d, announced %d", removed, e.Announced())
	}
	// A key re-announced after the pass began is not removed even if the
	// check (run before its store landed) missed it.
	racy := func(ctx context.Context, ks []offload.Key) ([]bool, error) {
		out, _ := check(ctx, ks)
		e.Stored([]offload.Key{keys[0]}) // stored again meanwhile
		mu.Lock()
		delete(server, keys[0])
		mu.Unlock()
		for i, k := range ks {
			if k == keys[0] {
				out[i] = false
			}
		}
		return out, nil
	}
	e.Take()
	if _, removed, _ := e.Reconcile(t.Context(), racy, ReconcileOptions{Batch: 1}); removed != 0 {
		t.Fatalf("a key announced during the pass was removed (%d)", removed)
	}
}

// The announced set is bounded: the oldest keys beyond the bound are
// published as removed, so an index never holds a key the tier forgot.
func TestAnnouncedBound(t *testing.T) {
	e := NewEvents("t", offload.MediumCPU, offload.LocalityUnspecified, 0)
	e.ann.max = 4
	for i := range 6 {
		e.Stored([]offload.Key{key(i)})
	}
	if got := removedKeys(e.Take()); !slices.Equal(got, []offload.Key{key(0), key(1)}) || e.Announced() != 4 {
		t.Fatalf("evicted %v (announced %d), want keys 0 and 1", got, e.Announced())
	}
	for i := range 5000 { // the order queue stays proportional
		e.Stored([]offload.Key{key(2 + i%4)})
	}
	if len(e.ann.order) > 2*len(e.ann.keys)+1024 {
		t.Fatalf("order queue %d for %d keys", len(e.ann.order), len(e.ann.keys))
	}
}

func TestReconcilerTriggeredAndStopped(t *testing.T) {
	e := NewEvents("t", offload.MediumCPU, offload.LocalityUnspecified, 0)
	e.Stored([]offload.Key{key(1)})
	e.Take()
	done := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	r := StartReconciler(ctx, &wg, ReconcilerConfig{Events: e, Check: func(context.Context, []offload.Key) ([]bool, error) {
		done <- struct{}{}
		return []bool{false}, nil
	}})
	r.Trigger()
	<-done
	cancel()
	wg.Wait()
	if st := r.Stats(); st.Runs != 1 || st.Removed != 1 {
		t.Fatalf("stats %+v", st)
	}
	if got := removedKeys(e.Take()); !slices.Equal(got, []offload.Key{key(1)}) {
		t.Fatalf("removed %v", got)
	}
	if StartReconciler(t.Context(), &wg, ReconcilerConfig{}) != nil {
		t.Fatal("a reconciler without events")
	}
	var nilR *Reconciler
	nilR.Trigger()
}
