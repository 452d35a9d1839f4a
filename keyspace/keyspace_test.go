package keyspace

import (
	"testing"

	"github.com/kvtier/kvtier/offload"
)

func TestSpacesKeepKeysApart(t *testing.T) {
	a, _ := New("acme")
	b, _ := New("beta")
	raw := []byte("block-hash\x00\x00\x00\x01")
	ka, kb := a.Key(raw), b.Key(raw)
	if ka == kb || ka == offload.Key(raw) {
		t.Fatalf("one engine key gave %q in acme and %q in beta", ka, kb)
	}
	if id, ok := IDOf(ka); !ok || id != a.ID() {
		t.Errorf("IDOf(acme key) = %d, %v; want %d", id, ok, a.ID())
	}
	if got, ok := a.Strip(ka); !ok || got != offload.Key(raw) {
		t.Errorf("acme.Strip(acme key) = %q, %v", got, ok)
	}
	if _, ok := b.Strip(ka); ok {
		t.Error("beta.Strip accepted an acme key")
	}
	a2, _ := New("acme")
	if a2.Key(raw) != ka {
		t.Error("the tag of a name changed between two calls: it must survive restarts")
	}
	var admin Space
	if admin.Key(raw) != offload.Key(raw) || admin.Tagged() {
		t.Error("the untagged space changed a key")
	}
	if _, ok := IDOf(offload.Key(raw)); ok {
		t.Error("an untagged key has a space")
	}
	if _, err := New(""); err == nil {
		t.Error("an empty name was accepted")
	}
}
