package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiering"
)

// TestEventsPublished checks that stored blocks reach a ZMQ subscriber as
// vLLM BlockStored events, self-describing when PrepareStore carried
// token metadata.
func TestEventsPublished(t *testing.T) {
	dir := shortTempDir(t)
	p, err := cpu.New(cpu.Config{SlotSize: slotSize, Capacity: slotSize * 16, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := tiering.New(tiering.Config{Primary: p, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := events.New(events.Config{Endpoint: "tcp://127.0.0.1:0", Mode: events.ModeBind, Model: "m", Tracker: events.TrackerConfig{SelfDescribing: true}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Namespaces: []server.NamespaceConfig{server.WithPublisher(server.ManagerNamespace("", m, p, offload.Parser{}), pub)},
		UnixSocket: dir + "/k.sock",
		Logger:     quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	ctx := ctxT(t)

	sub, err := zmtp.Dial(ctx, "tcp://"+pub.Addr().String(), zmtp.Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(pub.Stats().Subscribers) == 0 || pub.Stats().Subscribers[0].Subscriptions == 0; {
		if time.Now().After(deadline) {
			t.Fatal("subscriber never registered")
		}
		time.Sleep(time.Millisecond)
	}

	c, err := client.Dial(dir+"/k.sock", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.NewRequest(ctx, "r", ""); err != nil {
		t.Fatal(err)
	}
	k := offload.MakeKey([]byte{0, 0, 0, 0, 0, 0, 0, 42}, 0)
	meta := &kvtierv1.BlockMetadata{BlockHashes: [][]byte{[]byte(k.Hash())}, TokenIds: []int64{1, 2, 3, 4}, BlockSize: 4}
	res, err := c.PrepareStore(ctx, "r", []offload.Key{k}, []*kvtierv1.BlockMetadata{meta})
	if err != nil || !res.OK {
		t.Fatalf("prepare store: %v %v", res, err)
	}
	if err := c.CompleteStore(ctx, "r", res.Keys, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}

	frames, err := sub.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 3 || len(frames[1]) != 8 {
		t.Fatalf("want [topic, seq, payload], got %d frames", len(frames))
	}
	var batch []any
	if err := msgpack.Unmarshal(frames[2], &batch); err != nil {
		t.Fatal(err)
	}
	evs, _ := batch[1].([]any)
	if len(evs) != 1 {
		t.Fatalf("batch %v", batch)
	}
	ev, _ := evs[0].(map[string]any)
	if ev["type"] != "BlockStored" || ev["medium"] != "CPU" {
		t.Fatalf("event %v", ev)
	}
	if toks, _ := ev["token_ids"].([]any); len(toks) != 4 {
		t.Fatalf("self-describing event lacks its tokens: %v", ev)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.GetPrimary().GetUsedSlots() != 1 {
		t.Fatalf("stats %v %v", st, err)
	}
}
