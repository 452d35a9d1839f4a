package peer

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

func TestConfigValidation(t *testing.T) {
	ok := PeerConfig{Name: "a", Addr: "10.0.0.1:7070"}
	for _, tc := range []struct {
		name  string
		peers []PeerConfig
		key   string
		edit  func(*Config)
	}{
		{"ok", []PeerConfig{ok}, "", nil},
		{"index bound", []PeerConfig{ok}, "index_max_keys", func(c *Config) { c.IndexMaxKeys = MaxIndexKeys + 1 }},
		{"negative index bound", []PeerConfig{ok}, "index_max_keys", func(c *Config) { c.IndexMaxKeys = -1 }},
		{"negative resync", []PeerConfig{ok}, "resync_interval", func(c *Config) { c.ResyncInterval = -1 }},
		{"no peers", nil, "peers", nil},
		{"no name", []PeerConfig{{Addr: "h:1"}}, "peers[0].name", nil},
		{"duplicate", []PeerConfig{ok, ok}, "peers[1].name", nil},
		{"bad addr", []PeerConfig{ok, {Name: "b", Addr: "h"}}, "peers[1].addr", nil},
		{"bad locality", []PeerConfig{{Name: "b", Addr: "h:1", Locality: "moon"}}, "peers[0].locality", nil},
	} {
		c := Config{Name: "p", Peers: tc.peers}
		if tc.edit != nil {
			tc.edit(&c)
		}
		err := c.Validate()
		if tc.key == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.key+":") {
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.key)
		}
	}
}

func TestLocalityDerived(t *testing.T) {
	for addr, want := range map[string]offload.Locality{
		"127.0.0.1:1": offload.LocalityLocal, "[::1]:1": offload.LocalityLocal, "localhost:1": offload.LocalityLocal,
		"10.0.0.1:1": offload.LocalityRemote, "node-b.example:1": offload.LocalityRemote,
	} {
		if got, _ := LocalityOf(PeerConfig{Addr: addr}); got != want {
			t.Errorf("%s: %v, want %v", addr, got, want)
		}
	}
	if got, _ := LocalityOf(PeerConfig{Addr: "10.0.0.1:1", Locality: "local"}); got != offload.LocalityLocal {
		t.Errorf("explicit locality ignored: %v", got)
	}
}

// A peer that does not answer costs misses, and is marked down after
// unhealthy_after calls: later lookups miss without asking.
func TestDeadPeerMisses(t *testing.T) {
	// A probe interval no busy machine outlasts: the peer stays down for
	// the rest of the test, however slowly it runs.
	tier, err := New(Config{Name: "p", Peers: []PeerConfig{{Name: "dead", Addr: "127.0.0.1:1"}}, UnhealthyAfter: 1,
		Timeout: 500 * time.Millisecond, ProbeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close(context.Background())
	k := offload.MakeKey([]byte("0123456789abcdef"), 0)
	req, _ := offload.NewReqContext("r", nil)
	if r := tier.Lookup(k, req); r != offload.Retry {
		t.Fatalf("first lookup %v, want Retry", r)
	}
	tier.OnScheduleEnd(offload.ScheduleEnd{})
	for tier.HasPendingWork() { // the call is in flight on the tier's goroutine
		time.Sleep(time.Millisecond)
	}
	if r := tier.Lookup(k, req); r != offload.Miss {
		t.Fatalf("lookup after the failed call %v, want Miss", r)
	}
	if st := tier.Peers()[0]; st.Healthy || st.Contacts == 0 {
		t.Fatalf("peer stats %+v, want down after a contact", st)
	}
	// Down: a new request's lookup misses without a call.
	before := tier.Peers()[0].Contacts
	req2, _ := offload.NewReqContext("r2", nil)
	if r := tier.Lookup(offload.MakeKey([]byte("fedcba9876543210"), 0), req2); r != offload.Miss {
		t.Fatalf("lookup on a down peer %v, want Miss", r)
	}
	if tier.Peers()[0].Contacts != before {
		t.Fatal("a down peer was contacted")
	}
}
