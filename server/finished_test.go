package server_test

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
)

// finishWatch records, per request id, lookups a tier got after the
// manager told it the request finished: state the tier builds for them
// is never dropped.
type finishWatch struct {
	offload.SecondaryTier
	mu       sync.Mutex
	finished map[string]bool
	late     []string
}

func (w *finishWatch) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	w.mu.Lock()
	if req != nil && w.finished[req.ID] {
		w.late = append(w.late, req.ID)
	}
	w.mu.Unlock()
	return w.SecondaryTier.Lookup(key, req)
}

func (w *finishWatch) OnRequestFinished(req *offload.ReqContext) {
	w.mu.Lock()
	w.finished[req.ID] = true
	w.mu.Unlock()
	w.SecondaryTier.OnRequestFinished(req)
}

func (w *finishWatch) lateLookups() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.late...)
}

func watchedEnv(t *testing.T, latency time.Duration) (*env, *finishWatch) {
	t.Helper()
	var w *finishWatch
	e := startEnv(t, envOptions{tiers: func(t envT) []offload.SecondaryTier {
		m, err := memory.New(memory.Config{Name: "disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Latency: latency})
		if err != nil {
			t.Fatal(err)
		}
		w = &finishWatch{SecondaryTier: m, finished: map[string]bool{}}
		return []offload.SecondaryTier{w}
	}})
	return e, w
}

// TestFinishedRequestStartsNoWork: a finished request that still holds a
// pin may complete it, but lookups for it (Lookup, GetBlocks) are refused
// like PrepareLoad and PrepareStore, so that no tier builds lookup state
// for a request it was already told is finished.
func TestFinishedRequestStartsNoWork(t *testing.T) {
	e, w := watchedEnv(t, 0)
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	k, absent := key(1), key(2)
	if _, err := c.PutBlocks(ctx, []client.Block{{Key: k, Data: block(k)}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewRequest(ctx, "r", ""); err != nil {
		t.Fatal(err)
	}
	if _, hits, err := c.Lookup(ctx, "r", []offload.Key{k}, false); err != nil || hits != 1 {
		t.Fatalf("lookup: %d %v", hits, err)
	}
	if _, err := c.PrepareLoad(ctx, "r", []offload.Key{k}); err != nil {
		t.Fatal(err)
	}
	if err := c.FinishRequest(ctx, "r"); err != nil {
		t.Fatal(err)
	}

	_, _, err := c.Lookup(ctx, "r", []offload.Key{absent}, false)
	wantCode(t, err, codes.FailedPrecondition, "finished")
	_, err = c.GetBlocks(ctx, []offload.Key{absent}, client.GetOptions{CallOptions: client.CallOptions{RequestID: "r"}})
	wantCode(t, err, codes.FailedPrecondition, "finished")
	if late := w.lateLookups(); len(late) != 0 {
		t.Fatalf("tier looked up for finished requests %v", late)
	}
	// Completing what it started is still allowed, and drops the request.
	if err := c.CompleteLoad(ctx, "r", []offload.Key{k}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stats(ctx); err != nil || st.GetActiveRequests() != 0 {
		t.Fatalf("active requests %v %v", st.GetActiveRequests(), err)
	}
}

// TestGetBlocksRequestFinishedWhileWaiting: a request finished while its
// GetBlocks call waits for a promotion ends the call instead of looking
// up again for a request the tiers consider finished.
func TestGetBlocksRequestFinishedWhileWaiting(t *testing.T) {
	e, w := watchedEnv(t, 300*time.Millisecond)
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	k := key(1)
	if _, err := c.PutBlocks(ctx, []client.Block{{Key: k, Data: block(k)}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	// Wait for the cascade to the slow tier, then empty the primary so
	// that the block must be promoted from the tier.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetTiers()[0].GetCascadesOk() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cascade did not finish")
		}
		if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewRequest(ctx, "r", ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.GetBlocks(ctx, []offload.Key{k}, client.GetOptions{CallOptions: client.CallOptions{RequestID: "r"}, Wait: 5 * time.Second})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // GetBlocks is waiting for the promotion
	if err := c.FinishRequest(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if err == nil {
		t.Fatal("GetBlocks went on for a request finished while it waited")
	}
	if late := w.lateLookups(); len(late) != 0 {
		t.Fatalf("tier looked up for finished requests %v", late)
	}
}
