package client

import (
	"bytes"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

func TestIsUnixTarget(t *testing.T) {
	for _, tc := range []struct {
		target, path string
		unix         bool
	}{
		{"unix:///run/kvtier.sock", "/run/kvtier.sock", true},
		{"unix:kvtier.sock", "kvtier.sock", true},
		{"./kvtier.sock", "./kvtier.sock", true},
		{"kvtier.sock", "kvtier.sock", true},
		{"/tmp/k", "/tmp/k", true},
		{"127.0.0.1:7070", "", false},
		{"localhost:7070", "", false},
	} {
		path, ok := IsUnixTarget(tc.target)
		if ok != tc.unix || path != tc.path {
			t.Errorf("IsUnixTarget(%q) = %q, %v; want %q, %v", tc.target, path, ok, tc.path, tc.unix)
		}
	}
}

func TestKeyFields(t *testing.T) {
	a, b := offload.MakeKey([]byte("aaaa"), 1), offload.MakeKey([]byte("bbbb"), 2)
	raw, packed, size := keyFields([]offload.Key{a, b})
	if raw != nil || size != 8 || !bytes.Equal(packed, []byte(string(a)+string(b))) {
		t.Fatalf("uniform keys: raw=%v packed=%q size=%d", raw, packed, size)
	}
	c := offload.MakeKey([]byte("ccccc"), 0)
	raw, packed, size = keyFields([]offload.Key{a, c})
	if len(raw) != 2 || packed != nil || size != 0 || string(raw[1]) != string(c) {
		t.Fatalf("mixed keys: raw=%q packed=%q size=%d", raw, packed, size)
	}
	raw, packed, _ = keyFields(nil)
	if len(raw) != 0 || packed != nil {
		t.Fatal("no keys")
	}
}
