package offload_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

func TestKey(t *testing.T) {
	cases := []struct {
		name  string
		hash  []byte
		group uint32
		wire  uint64
	}{
		{"sha256-sized", []byte("0123456789abcdef0123456789abcdef"), 0, 0x3839616263646566},
		{"short hash is left-padded", []byte{0x01, 0x02}, 7, 0x0102},
		{"exactly 8 bytes", []byte{1, 2, 3, 4, 5, 6, 7, 8}, 0xdeadbeef, 0x0102030405060708},
		{"ascii like the upstream tests", []byte("12"), 1, 0x3132},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := offload.MakeKey(c.hash, c.group)
			if len(k) != len(c.hash)+offload.GroupSuffixLen || !k.Valid() {
				t.Fatalf("len %d valid %v", len(k), k.Valid())
			}
			if k.Hash() != string(c.hash) || k.Group() != c.group {
				t.Fatalf("Hash %x Group %d", k.Hash(), k.Group())
			}
			if got := string(k[len(k)-4:]); got != string([]byte{byte(c.group >> 24), byte(c.group >> 16), byte(c.group >> 8), byte(c.group)}) {
				t.Fatalf("group suffix %x not big-endian", got)
			}
			if k.WireHash() != c.wire || offload.WireHash(string(c.hash)) != c.wire {
				t.Fatalf("WireHash = %#x, want %#x", k.WireHash(), c.wire)
			}
			k2, err := offload.KeyFromBytes([]byte(k))
			if err != nil || k2 != k {
				t.Fatalf("KeyFromBytes: %v %v", k2, err)
			}
			if !strings.HasSuffix(k.String(), "/g"+strconv.FormatUint(uint64(c.group), 10)) {
				t.Fatalf("String %s", k)
			}
		})
	}
	for _, n := range []int{0, 4, offload.MaxKeyLen + 1} {
		if _, err := offload.KeyFromBytes(make([]byte, n)); !errors.Is(err, offload.ErrInvalidKey) {
			t.Errorf("KeyFromBytes(%d bytes) err = %v", n, err)
		}
	}
	for _, k := range []offload.Key{"", "abc"} {
		if k.Valid() || k.Hash() != "" || k.Group() != 0 {
			t.Errorf("invalid key %q: valid %v hash %q group %d", k, k.Valid(), k.Hash(), k.Group())
		}
	}
}
