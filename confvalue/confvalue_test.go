package confvalue

import (
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

func TestParseByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want ByteSize
		ok   bool
	}{
		{"0", 0, true},
		{"1073741824", GiB, true},
		{"2MiB", 2 * MiB, true},
		{"2 mib", 2 * MiB, true},
		{"1.5GiB", 3 * GiB / 2, true},
		{"512KiB", 512 * KiB, true},
		{"1TiB", TiB, true},
		{"10KB", 10000, true},
		{"3gb", 3e9, true},
		{"7B", 7, true},
		{"0.5B", 0, false},
		{"1G", 0, false},
		{"-1", 0, false},
		{"", 0, false},
		{"1e3", 0, false},
		{"99999999999TiB", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseByteSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	for b, want := range map[ByteSize]string{2 * MiB: "2MiB", GiB: "1GiB", 1536 * KiB: "1536KiB", 7: "7B", 0: "0B"} {
		if got := b.String(); got != want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(b), got, want)
		}
	}
}

func TestParseLocality(t *testing.T) {
	for in, want := range map[string]offload.Locality{"": offload.LocalityUnspecified, "local": offload.LocalityLocal, "LOCAL": offload.LocalityLocal, "Remote": offload.LocalityRemote} {
		if got, err := ParseLocality(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"global", "GLOBAL", "moon", " local"} {
		if _, err := ParseLocality(bad); err == nil || !strings.Contains(err.Error(), "want local or remote") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
