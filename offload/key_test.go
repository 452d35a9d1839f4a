package offload_test

import (
	"encoding/hex"
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
			if k.String() != hex.EncodeToString([]byte(k)) {
				t.Fatalf("String %s, want the hex of the key's bytes", k)
			}
			for _, s := range []string{k.String(), strings.ToUpper(k.String()), k.HexHash() + "/g" + strconv.FormatUint(uint64(c.group), 10)} {
				if p, err := offload.ParseKey(s); err != nil || p != k {
					t.Fatalf("ParseKey(%q) = %v, %v", s, p, err)
				}
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

func TestParseKeyErrors(t *testing.T) {
	for _, s := range []string{"", "zz", "0102", "abc", "01/gx", "/g1", "0102/g99999999999", strings.Repeat("00", offload.MaxKeyLen+1)} {
		if k, err := offload.ParseKey(s); err == nil {
			t.Errorf("ParseKey(%q) = %v, want an error", s, k)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"0102030400000001", "01/g1", "", "zz/g"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := offload.ParseKey(s)
		if err != nil {
			return
		}
		if !k.Valid() {
			t.Fatalf("ParseKey(%q) returned an invalid key", s)
		}
		if k2, err := offload.ParseKey(k.String()); err != nil || k2 != k {
			t.Fatalf("round trip of %q: %v, %v", s, k2, err)
		}
	})
}
