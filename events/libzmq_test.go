//go:build libzmq

// Tests against libzmq itself through pebbe/zmq4 (cgo). Run with
//
//	go test -tags libzmq ./events/
//
// (needs Debian libzmq3-dev). They repeat the stalled-subscriber and replay
// checks with a C implementation of ZMTP as the peer.

package events

import (
	"encoding/binary"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvtier/kvtier/offload"
)

func libzmqSocket(t *testing.T, typ zmq.Type, endpoint string) *zmq.Socket {
	t.Helper()
	s, err := zmq.NewSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(15 * time.Second)
	if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLibzmqStalledAndHealthySubscribers(t *testing.T) {
	const n, hwm = 3000, 200
	p := newPublisher(t, Config{HWM: hwm})
	stalled := libzmqSocket(t, zmq.SUB, pubEndpoint(p))
	_ = stalled.SetRcvhwm(10)
	_ = stalled.SetSubscribe("kv@")
	healthy := libzmqSocket(t, zmq.SUB, pubEndpoint(p))
	_ = healthy.SetSubscribe("kv@")
	waitFor(t, "two subscriptions", func() bool { return subscriptions(p) == 2 })

	keys := make([]offload.Key, 256)
	for i := range keys {
		keys[i] = chunkKey(uint64(i), 0)
	}
	evs := []offload.Event{{Keys: keys, Medium: offload.MediumCPU}}
	for i := range n {
		if err := p.Publish(evs); err != nil {
			t.Fatal(err)
		}
		if i%(hwm/2) == hwm/2-1 {
			// Let the healthy subscriber keep up; the stalled one cannot.
			for j := i - hwm/2 + 1; j <= i; j++ {
				msg, err := healthy.RecvMessageBytes(0)
				if err != nil {
					t.Fatalf("healthy recv %d: %v", j, err)
				}
				if seq := binary.BigEndian.Uint64(msg[1]); seq != uint64(j) {
					t.Fatalf("healthy got seq %d, want %d", seq, j)
				}
				if j%hwm == 0 {
					decodeLLMD(t, msg[2])
				}
			}
		}
	}
	if st := p.Stats(); st.SubscriberDrops == 0 {
		t.Errorf("the stalled libzmq subscriber dropped nothing: %+v", st)
	}
}

func TestLibzmqDealerReplay(t *testing.T) {
	p := newPublisher(t, Config{})
	for i := range 5 {
		_ = p.Publish(stepEvents(i))
	}
	d := libzmqSocket(t, zmq.DEALER, "tcp://"+p.ReplayAddr().String())
	if _, err := d.SendMessage("", binary.BigEndian.AppendUint64(nil, 2)); err != nil {
		t.Fatal(err)
	}
	for want := int64(2); ; want++ {
		msg, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		if len(msg) != 4 {
			t.Fatalf("%d frames", len(msg))
		}
		seq := int64(binary.BigEndian.Uint64(msg[2]))
		if seq == -1 {
			if want != 5 {
				t.Fatalf("terminator after %d", want)
			}
			return
		}
		if seq != want {
			t.Fatalf("seq %d, want %d", seq, want)
		}
	}
}
