package events

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/offload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var fixedNow = func() time.Time { return time.Unix(1789095808, 830000000) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newPublisher binds PUB and replay on loopback ports.
func newPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
		cfg.Mode = ModeBind
	}
	if cfg.ReplayEndpoint == "" {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	if cfg.Host == "" {
		cfg.Host = "h"
	}
	if cfg.Now == nil {
		cfg.Now = fixedNow
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(ctxT(t, 5*time.Second)) })
	return p
}

func pubEndpoint(p *Publisher) string { return "tcp://" + p.Addr().String() }

func subscriptions(p *Publisher) int {
	n := 0
	for _, s := range p.Stats().Subscribers {
		n += s.Subscriptions
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// goSub is a Go subscriber: a ZMTP SUB connection subscribed to "kv@".
func goSub(t *testing.T, p *Publisher) *zmtp.Conn {
	t.Helper()
	before := subscriptions(p)
	c, err := zmtp.Dial(ctxT(t, 10*time.Second), pubEndpoint(p), zmtp.Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Subscribe([]byte("kv@")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscription", func() bool { return subscriptions(p) > before })
	return c
}

type wireBatch struct {
	topic   string
	seq     uint64
	payload []byte
}

func recvBatch(t testing.TB, c *zmtp.Conn) wireBatch {
	t.Helper()
	_ = c.NetConn().SetReadDeadline(time.Now().Add(15 * time.Second))
	msg, err := c.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	if len(msg) != 3 || len(msg[1]) != 8 {
		t.Fatalf("got %d frames (seq %d bytes), want [topic, 8-byte seq, payload]", len(msg), len(msg[1]))
	}
	return wireBatch{string(msg[0]), binary.BigEndian.Uint64(msg[1]), msg[2]}
}

func stepEvents(i int) []offload.Event {
	return []offload.Event{
		{Keys: []offload.Key{chunkKey(uint64(10*i+1), 0), chunkKey(uint64(10*i+2), 0)}, Medium: offload.MediumCPU},
		{Keys: []offload.Key{chunkKey(uint64(10*i+3), 1)}, Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Removed: true},
	}
}

// llm-d main decodes the array form only: a publisher configured with
// positional: true is indexed by it, the default map form is refused (the
// README's consumer table says so).
func TestGoSubscriberDecodesLikeLLMDMain(t *testing.T) {
	p := newPublisher(t, Config{DPRank: 0, Format: Format{Positional: true}, Tracker: TrackerConfig{SelfDescribing: true}})
	if p.Topic() != fmt.Sprintf("kv@h:%d@m", p.Addr().(*net.TCPAddr).Port) {
		t.Fatalf("topic %q", p.Topic())
	}
	c := goSub(t, p)
	k, m := chunkMeta(0, 1, 4)
	mustRecord(t, p.Tracker(), k, m)
	if err := p.Publish([]offload.Event{{Keys: []offload.Key{k}, Medium: offload.MediumCPU}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := p.Publish(stepEvents(i)); err != nil {
			t.Fatal(err)
		}
	}
	b := recvBatch(t, c)
	if b.topic != p.Topic() || b.seq != 0 {
		t.Fatalf("first batch topic %q seq %d", b.topic, b.seq)
	}
	batch, evs, err := decodeLLMDMain(b.payload)
	if err != nil {
		t.Fatal(err)
	}
	if batch.TS != 1789095808.83 || *batch.DataParallelRank != 0 || len(evs) != 1 {
		t.Fatalf("batch %+v with %d events", batch, len(evs))
	}
	st := evs[0].(*llmdStored)
	if st.BlockSize != 4 || !slices.Equal(st.TokenIDs, []uint32{1, 2, 3, 4}) || *st.Medium != "CPU" || *st.SpecKind != SpecKindFullAttention {
		t.Errorf("self-describing event %+v", st)
	}
	for i := range 3 {
		b := recvBatch(t, c)
		if b.seq != uint64(i+1) {
			t.Fatalf("seq %d, want %d", b.seq, i+1)
		}
		_, evs, err := decodeLLMDMain(b.payload)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 3 {
			t.Fatalf("batch %d: %d events, want 3", i, len(evs))
		}
		s0, s1, r := evs[0].(*llmdStored), evs[1].(*llmdStored), evs[2].(*llmdRemoved)
		if normaliseOne(s0.BlockHashes[0]) != uint64(10*i+1) || normaliseOne(s1.BlockHashes[0]) != uint64(10*i+2) ||
			*s0.Medium != "CPU" || s0.BlockSize != 0 || *s0.GroupIdx != 0 {
			t.Errorf("stored events %+v %+v", s0, s1)
		}
		if normaliseOne(r.BlockHashes[0]) != uint64(10*i+3) || *r.Medium != "STORAGE" || *r.GroupIdx != 1 {
			t.Errorf("removed event %+v", r)
		}
	}
	st2 := p.Stats()
	if st2.BatchesPublished != 4 || st2.EventsPublished != 10 || st2.NextSeq != 4 {
		t.Errorf("stats %+v", st2)
	}
	var mb Batch
	p.Tracker().Translate(&mb, stepEvents(0))
	if _, _, err := decodeLLMDMain(Format{}.AppendBatch(nil, 1, mb.Events, 0)); err == nil {
		t.Error("llm-d main's decoding accepted a map-form batch")
	}
}

// replayFrom asks the replay endpoint for batches from start on through a
// DEALER and returns their seqs; it checks the five-frame terminator.
func replayFrom(t *testing.T, p *Publisher, start uint64) []uint64 {
	t.Helper()
	d, err := zmtp.Dial(ctxT(t, 10*time.Second), "tcp://"+p.ReplayAddr().String(), zmtp.Dealer, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Send([]byte{}, binary.BigEndian.AppendUint64(nil, start)); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for {
		_ = d.NetConn().SetReadDeadline(time.Now().Add(10 * time.Second))
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay recv: %v", err)
		}
		// On the wire to a DEALER: ["", topic, seq, payload].
		if len(msg) != 4 || len(msg[0]) != 0 || len(msg[2]) != 8 {
			t.Fatalf("replay reply %q", msg)
		}
		if int64(binary.BigEndian.Uint64(msg[2])) == -1 {
			if len(msg[1]) != 0 || len(msg[3]) != 0 {
				t.Fatalf("terminator %q, want empty topic and payload", msg)
			}
			return seqs
		}
		if string(msg[1]) != p.Topic() {
			t.Fatalf("replayed topic %q", msg[1])
		}
		decodeLLMD(t, msg[3])
		seqs = append(seqs, binary.BigEndian.Uint64(msg[2]))
	}
}

func TestReplayThroughDealer(t *testing.T) {
	p := newPublisher(t, Config{BufferSteps: 3})
	for i := range 5 {
		if err := p.Publish(stepEvents(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := replayFrom(t, p, 3); !slices.Equal(got, []uint64{3, 4}) {
		t.Errorf("replay from 3: %v", got)
	}
	// Only the last BufferSteps batches are kept.
	if got := replayFrom(t, p, 0); !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Errorf("replay from 0: %v", got)
	}
	if got := replayFrom(t, p, 9); len(got) != 0 {
		t.Errorf("replay from the future: %v", got)
	}
	// A malformed request is ignored; the connection keeps working.
	d, err := zmtp.Dial(ctxT(t, 10*time.Second), "tcp://"+p.ReplayAddr().String(), zmtp.Dealer, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_ = d.Send([]byte("x"), []byte{1})
	_ = d.Send([]byte{}, binary.BigEndian.AppendUint64(nil, 4))
	_ = d.NetConn().SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, err := d.Recv()
	if err != nil || binary.BigEndian.Uint64(msg[2]) != 4 {
		t.Fatalf("after a malformed request: %q %v", msg, err)
	}
	waitFor(t, "rejected count", func() bool { return p.Stats().ReplayRejected == 1 })
}

// Drop-oldest: a backed-up queue loses its oldest batches, counts them and
// leaves a sequence gap the subscriber sees; replay still has them.
func TestQueueFullDropsOldestWithGap(t *testing.T) {
	p := newPublisher(t, Config{MaxQueueSize: 4})
	c := goSub(t, p)
	for i := range 2 {
		_ = p.Publish(stepEvents(i))
	}
	for want := range uint64(2) {
		if b := recvBatch(t, c); b.seq != want {
			t.Fatalf("seq %d, want %d", b.seq, want)
		}
	}
	p.gate.Lock() // the sender cannot hand batches to the socket
	for i := 2; i < 12; i++ {
		if err := p.Publish(stepEvents(i)); err != nil {
			t.Fatal(err) // never blocks, never fails
		}
	}
	p.gate.Unlock()
	var got []uint64
	for len(got) == 0 || got[len(got)-1] != 11 {
		got = append(got, recvBatch(t, c).seq)
	}
	st := p.Stats()
	if uint64(len(got))+st.BatchesDropped != 10 || st.BatchesDropped == 0 {
		t.Fatalf("received %v, dropped %d; want 10 in all with drops", got, st.BatchesDropped)
	}
	if !slices.Equal(got[len(got)-4:], []uint64{8, 9, 10, 11}) {
		t.Fatalf("received %v, want the newest four (8..11) kept", got)
	}
	if got[0] == 2 && len(got) == 10 {
		t.Fatalf("no gap in %v", got)
	}
	if r := replayFrom(t, p, 2); !slices.Equal(r, []uint64{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
		t.Errorf("replay from 2: %v, want 2..11", r)
	}
}

// A subscriber that connects and never reads must not keep a healthy one
// from getting every batch.
func TestStalledSubscriberDoesNotStarveHealthy(t *testing.T) {
	const n, hwm = 2000, 400
	p := newPublisher(t, Config{HWM: hwm})
	stalled := goSub(t, p)
	_ = stalled
	healthy := goSub(t, p)
	// Big batches fill the stalled subscriber's socket buffers quickly.
	keys := make([]offload.Key, 256)
	for i := range keys {
		keys[i] = chunkKey(uint64(i), 0)
	}
	evs := []offload.Event{{Keys: keys, Medium: offload.MediumCPU}}
	var got atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			_ = healthy.NetConn().SetReadDeadline(time.Now().Add(15 * time.Second))
			msg, err := healthy.Recv()
			if err != nil {
				errc <- err
				return
			}
			if seq := binary.BigEndian.Uint64(msg[1]); seq != uint64(i) {
				errc <- fmt.Errorf("healthy subscriber got seq %d, want %d", seq, i)
				return
			}
			got.Add(1)
		}
		errc <- nil
	}()
	for i := range n {
		for int64(i)-got.Load() >= hwm/2 {
			time.Sleep(time.Millisecond)
		}
		if err := p.Publish(evs); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.SubscriberDrops == 0 || st.BatchesDropped != 0 {
		t.Errorf("subscriber drops %d (want > 0: the stalled one), queue drops %d (want 0)", st.SubscriberDrops, st.BatchesDropped)
	}
}

// Close delivers every queued batch to a healthy subscriber.
func TestCloseDeliversQueued(t *testing.T) {
	const n = 3000
	p := newPublisher(t, Config{})
	c := goSub(t, p)
	for i := range n {
		if err := p.Publish(stepEvents(i)); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close(ctxT(t, 15*time.Second)) }()
	for i := range n {
		if b := recvBatch(t, c); b.seq != uint64(i) {
			t.Fatalf("seq %d, want %d", b.seq, i)
		}
	}
	c.Close()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Publish(stepEvents(0)); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
}

func TestEmptyStepPublishesNothing(t *testing.T) {
	p := newPublisher(t, Config{})
	if err := p.Publish(nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish([]offload.Event{{Medium: offload.MediumCPU}}); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.NextSeq != 0 {
		t.Errorf("empty steps consumed %d sequence numbers", st.NextSeq)
	}
}

// Connect mode: the subscriber binds (llm-d's local mode) and the
// publisher connects to it.
func TestConnectToBindingSubscriber(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ep := "tcp://" + ln.Addr().String()
	if ShouldBind(ep) {
		t.Fatalf("%s should connect by vLLM's rule", ep)
	}
	p := newPublisher(t, Config{Endpoint: ep, Topic: "kv@pod@model"})
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c, err := zmtp.Handshake(ctxT(t, 10*time.Second), nc, zmtp.Sub, nil, zmtp.ClientMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscription", func() bool { return subscriptions(p) == 1 })
	_ = p.Publish(stepEvents(0))
	if b := recvBatch(t, c); b.topic != "kv@pod@model" || b.seq != 0 {
		t.Fatalf("got %q seq %d", b.topic, b.seq)
	}
}

func TestEndpointRules(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/kv": true, "inproc://kv": true,
		"tcp://10.0.0.5:5557": false, "tcp://router.svc:5557": false,
	} {
		if ShouldBind(ep) != want {
			t.Errorf("ShouldBind(%q) = %v", ep, !want)
		}
	}
	for _, tc := range []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 2, "tcp://*:5559"},
		{"tcp://[::1]:7000", 1, "tcp://[::1]:7001"},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"},
		{"inproc://kv", 3, "inproc://kv_dp3"},
	} {
		if got, err := OffsetEndpoint(tc.ep, tc.rank); err != nil || got != tc.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", tc.ep, tc.rank, got, err, tc.want)
		}
	}
	if _, err := OffsetEndpoint("tcp://*:x", 1); err == nil {
		t.Error("OffsetEndpoint accepted a non-numeric port")
	}
	if _, err := New(Config{Endpoint: "inproc://x"}); err == nil {
		t.Error("New accepted inproc://")
	}
	if _, err := New(Config{Endpoint: "tcp://127.0.0.1:0", Mode: "sideways"}); err == nil {
		t.Error("New accepted an unknown mode")
	}
}

func TestIPCAndDPRank(t *testing.T) {
	dir := t.TempDir()
	p := newPublisher(t, Config{Endpoint: "ipc://" + filepath.Join(dir, "kv"), ReplayEndpoint: "ipc://" + filepath.Join(dir, "replay"), DPRank: 1})
	if p.Topic() != "kv@h@m" {
		t.Errorf("ipc default topic %q", p.Topic())
	}
	c, err := zmtp.Dial(ctxT(t, 10*time.Second), "ipc://"+filepath.Join(dir, "kv_dp1"), zmtp.Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.Subscribe(nil)
	waitFor(t, "subscription", func() bool { return subscriptions(p) == 1 })
	_ = p.Publish(stepEvents(0))
	batch, _ := decodeLLMD(t, recvBatch(t, c).payload)
	if *batch.DataParallelRank != 1 {
		t.Errorf("dp_rank %d, want 1", *batch.DataParallelRank)
	}
	if _, err := os.Stat(filepath.Join(dir, "replay_dp1")); err != nil {
		t.Errorf("replay endpoint not offset: %v", err)
	}
}

// pythonPath returns the interpreter for integration tests, or skips.
func pythonPath(t *testing.T) string {
	t.Helper()
	py := os.Getenv("KVTIER_TEST_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	require := os.Getenv("KVTIER_REQUIRE_INTEGRATION") == "1"
	if out, err := exec.Command(py, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		if require {
			t.Fatalf("KVTIER_REQUIRE_INTEGRATION=1 but %s cannot import zmq and msgpack: %v\n%s", py, err, out)
		}
		t.Skipf("%s lacks pyzmq/msgpack (Debian python3-zmq python3-msgpack): %v", py, err)
	}
	return py
}

type pyResult struct {
	Live       []pyBatch `json:"live"`
	Replayed   []pyBatch `json:"replayed"`
	Terminator *struct {
		Topic   string `json:"topic"`
		Payload string `json:"payload"`
	} `json:"terminator"`
}

type pyBatch struct {
	Topic  string           `json:"topic"`
	Seq    uint64           `json:"seq"`
	TS     float64          `json:"ts"`
	DPRank int              `json:"dp_rank"`
	Events []map[string]any `json:"events"`
}

// runPython starts the subscriber script and waits for it to subscribe.
func runPython(t *testing.T, p *Publisher, count int, replay string, from uint64) (wait func() pyResult) {
	t.Helper()
	py := pythonPath(t)
	cmd := exec.Command(py, "testdata/kv_subscriber.py", pubEndpoint(p), replay, fmt.Sprint(count), fmt.Sprint(from))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	if strings.TrimSpace(line) != "READY" {
		t.Fatalf("python subscriber: %q %v\n%s", line, err, stderr.String())
	}
	waitFor(t, "python subscription", func() bool { return subscriptions(p) >= 1 })
	return func() pyResult {
		line, err := r.ReadString('\n')
		if err != nil {
			_ = cmd.Wait()
			t.Fatalf("python subscriber failed: %v\n%s", err, stderr.String())
		}
		var res pyResult
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber()
		if err := d.Decode(&res); err != nil {
			t.Fatalf("python output %q: %v", line, err)
		}
		return res
	}
}

// wantPyEvents is stepEvents(i) as Python's msgpack decodes it: maps with
// every field without a default present (None as nil) and defaults
// omitted.
func wantPyEvents(i int) []map[string]any {
	stored := func(hash int) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": []any{json.Number(fmt.Sprint(hash))},
			"parent_block_hash": nil, "token_ids": []any{}, "block_size": json.Number("0"), "lora_id": nil,
			"medium": "CPU", "lora_name": nil, "group_idx": json.Number("0")}
	}
	return []map[string]any{stored(10*i + 1), stored(10*i + 2), {
		"type": "BlockRemoved", "block_hashes": []any{json.Number(fmt.Sprint(10*i + 3))},
		"medium": "STORAGE", "group_idx": json.Number("1"), "locality": "LOCAL"}}
}

func TestPythonSubscriberAndReplay(t *testing.T) {
	const n = 50
	p := newPublisher(t, Config{DPRank: 0})
	wait := runPython(t, p, n, "tcp://"+p.ReplayAddr().String(), 45)
	for i := range n {
		if err := p.Publish(stepEvents(i)); err != nil {
			t.Fatal(err)
		}
	}
	res := wait()
	if len(res.Live) != n {
		t.Fatalf("python received %d batches, want %d", len(res.Live), n)
	}
	for i, b := range res.Live {
		if b.Topic != p.Topic() || b.Seq != uint64(i) || b.TS != 1789095808.83 || b.DPRank != 0 {
			t.Fatalf("batch %d: topic %q seq %d ts %v rank %d", i, b.Topic, b.Seq, b.TS, b.DPRank)
		}
		if d := cmp.Diff(wantPyEvents(i), b.Events); d != "" {
			t.Fatalf("batch %d events (-want +got):\n%s", i, d)
		}
	}
	var seqs []uint64
	for _, b := range res.Replayed {
		seqs = append(seqs, b.Seq)
		if d := cmp.Diff(wantPyEvents(int(b.Seq)), b.Events); d != "" {
			t.Fatalf("replayed batch %d (-want +got):\n%s", b.Seq, d)
		}
	}
	if !slices.Equal(seqs, []uint64{45, 46, 47, 48, 49}) {
		t.Errorf("replayed seqs %v, want 45..49", seqs)
	}
	if res.Terminator == nil || res.Terminator.Topic != "" || res.Terminator.Payload != "" {
		t.Errorf("terminator %+v, want empty topic and payload", res.Terminator)
	}
}

// Shutdown delivery to a real libzmq subscriber: batches published right
// before Close all arrive.
func TestPythonSubscriberGetsEverythingOnClose(t *testing.T) {
	const n = 2000
	p := newPublisher(t, Config{})
	wait := runPython(t, p, n, "-", 0)
	for i := range n {
		if err := p.Publish(stepEvents(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(ctxT(t, 15*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	res := wait()
	if len(res.Live) != n || res.Live[n-1].Seq != n-1 {
		t.Fatalf("python received %d batches, want %d", len(res.Live), n)
	}
}
