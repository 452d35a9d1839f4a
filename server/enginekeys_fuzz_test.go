package server

import (
	"testing"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// FuzzSpaceKeys: a tenant's engine sends any packed keys; spaceKeys
// accepts exactly what packedKeys accepts whose keys fit behind the
// space's tag, and answers each key in the tenant's space, never panicking.
func FuzzSpaceKeys(f *testing.F) {
	f.Add([]byte("0123456789abcdef\x00\x00\x00\x00"), uint32(20), 4)
	f.Add([]byte{}, uint32(0), 4)
	f.Add([]byte("abc"), uint32(2), 4)
	f.Add(make([]byte, 1020), uint32(1020), 4) // fits alone, not behind the tag
	sp, err := keyspace.Tenant("acme")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, packed []byte, size uint32, max int) {
		max = max%64 + 1
		if max <= 0 {
			max += 64
		}
		want, werr := packedKeys(packed, size, max)
		if werr == nil && len(want) > 0 && len(want[0])+keyspace.TagLen > offload.MaxKeyLen {
			werr = offload.ErrInvalidKey // does not fit behind the tag
			want = nil
		}
		got, gerr := spaceKeys(sp, packed, size, max)
		if (werr == nil) != (gerr == nil) || len(want) != len(got) {
			t.Fatalf("packedKeys: %d keys, %v; spaceKeys: %d keys, %v", len(want), werr, len(got), gerr)
		}
		for i := range got {
			raw, ok := sp.Strip(got[i])
			if !ok || raw != want[i] {
				t.Fatalf("key %d: %q, want %q in acme's space", i, got[i], want[i])
			}
		}
	})
}
