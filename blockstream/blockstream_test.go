package blockstream

import (
	"bytes"
	"testing"
)

// Sum equals the piecewise Summer, and changes with any flipped byte.
func TestSum(t *testing.T) {
	for _, n := range []int{0, 1, Chunk - 1, Chunk, Chunk + 1, 2<<20 + 5} {
		b := bytes.Repeat([]byte{1, 2, 3, 5, 7}, n/5+1)[:n]
		var s Summer
		for off := 0; off < n; off += Chunk {
			s.Write(b[off:min(off+Chunk, n)])
		}
		if s.Sum64() != Sum(b) {
			t.Fatalf("%d bytes: summer and Sum differ", n)
		}
		if n > 0 {
			want := Sum(b)
			b[n/2] ^= 1
			if Sum(b) == want {
				t.Fatalf("%d bytes: a flipped byte keeps the sum", n)
			}
		}
	}
}
