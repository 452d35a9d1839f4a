package fs

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

// A power loss must never make a block read back as other bytes: blocks
// are stored through a vfstest.PowerCut, the power is cut (every byte written
// since its file's last sync is lost, as zeros or as a shorter file, while
// the renames survive), and a new tier on the same directory loads every
// block. In format kvtier the checksum turns a damaged file into a miss
// with any fsync setting; format vllm has no checksum, so it defaults to
// fsync block. fsync none in format vllm is the control: it must serve
// zeros, or the test would prove nothing.
func TestPowerLossNeverServesDamagedBlocks(t *testing.T) {
	const bs, n = 8192, 24
	for _, tc := range []struct {
		format, fsync string
		loss          vfstest.Loss
		wantWrong     bool
	}{
		{"kvtier", "", vfstest.LoseToZeros, false},
		{"kvtier", "", vfstest.LoseToTruncation, false},
		{"kvtier", "block", vfstest.LoseToZeros, false},
		{"vllm", "", vfstest.LoseToZeros, false}, // default: block
		{"vllm", "", vfstest.LoseToTruncation, false},
		{"vllm", "batch", vfstest.LoseToZeros, false},
		{"vllm", "none", vfstest.LoseToZeros, true},
	} {
		name := fmt.Sprintf("format=%s,fsync=%s,loss=%d", tc.format, tc.fsync, tc.loss)
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			pc := vfstest.NewPowerCut(vfs.OS())
			mod := func(fs vfs.FS) func(*Config) {
				return func(c *Config) {
					c.Format, c.Fsync, c.FS, c.ODirect = tc.format, tc.fsync, fs, "off"
					c.Namespace.BlockBytes = bs
				}
			}
			tier, err := New(testConfig(dir, mod(pc)))
			if err != nil {
				t.Fatal(err)
			}
			a := newArena(bs, n, true)
			keys := make([]offload.Key, n)
			slots := make([]int64, n)
			want := make([][]byte, n)
			for i := range keys {
				keys[i], slots[i] = k(i), int64(i)
				a.fill(int64(i), uint64(i)+1)
				want[i] = slices.Clone(a.slot(int64(i)))
			}
			// Stores in jobs of 4, like cascades of several requests.
			for i := 0; i < n; i += 4 {
				if res := run(t, tier, false, a, req("r"), keys[i:i+4], slots[i:i+4]); !res.Success {
					t.Fatalf("store: %v", res.Err)
				}
			}
			lost, err := pc.Cut(tc.loss)
			if err != nil {
				t.Fatal(err)
			}
			_ = tier.Close(context.Background()) // the process is dead; this only releases the lock
			t.Logf("%d files lost data", lost)

			after := newTier(t, dir, mod(nil))
			b := newArena(bs, n, true)
			res := run(t, after, true, b, req("r2"), keys, slots)
			wrong, served := 0, 0
			ok := res.SuccessfulKeys
			if res.Success {
				ok = keys
			}
			for _, key := range ok {
				i := slices.Index(keys, key)
				served++
				if !bytes.Equal(b.slot(int64(i)), want[i]) {
					wrong++
				}
			}
			t.Logf("after the power cut: %d of %d blocks served, %d of them wrong (%v)", served, n, wrong, res.Err)
			if tc.wantWrong {
				if wrong == 0 {
					t.Fatal("fsync none in format vllm served no damaged block: the power cut lost nothing")
				}
				return
			}
			if wrong > 0 {
				t.Fatalf("%d blocks served with bytes they were not stored with", wrong)
			}
			if tc.fsync != "none" && tc.format == "vllm" && served != n {
				t.Fatalf("with fsync every block stored before the cut must survive it: %d of %d", served, n)
			}
		})
	}
}
