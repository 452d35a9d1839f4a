package offload

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestClaims(t *testing.T) {
	c := NewClaims(3)
	j := &Job{Claims: c}
	if !j.Claim(0) {
		t.Fatal("claim of a fresh block failed")
	}
	if c.Revoke(0) || c.Revoked(0) {
		t.Fatal("revoked a block being read")
	}
	j.Release(0)
	if !c.Revoke(0) || !c.Revoked(0) {
		t.Fatal("could not revoke a block read and released")
	}
	if c.Revoke(0) {
		t.Fatal("a second Revoke reported true")
	}
	if j.Claim(0) {
		t.Fatal("claimed a block taken back")
	}
	if !c.Revoke(1) || j.Claim(1) || !j.Claim(2) {
		t.Fatal("blocks are not independent")
	}
	if !(&Job{}).Claim(0) {
		t.Fatal("a job without claims must always claim")
	}
	(&Job{}).Release(0) // no-op, no panic
}

// Readers on several goroutines (the jobs of one cascade in several
// tiers) and the manager revoking: no claim succeeds after a revoke, and
// a revoke never succeeds while a block is claimed.
func TestClaimsConcurrent(t *testing.T) {
	const blocks, tiers = 64, 4
	for range 50 {
		c := NewClaims(blocks)
		var reading [blocks]atomic.Int32
		var bad atomic.Int32
		var wg sync.WaitGroup
		for range tiers {
			wg.Go(func() {
				j := &Job{Claims: c}
				for i := range blocks {
					if !j.Claim(i) {
						continue
					}
					reading[i].Add(1)
					if c.Revoked(i) {
						bad.Add(1)
					}
					reading[i].Add(-1)
					j.Release(i)
				}
			})
		}
		for i := range blocks {
			if c.Revoke(i) && reading[i].Load() != 0 {
				bad.Add(1)
			}
		}
		wg.Wait()
		if bad.Load() != 0 {
			t.Fatalf("%d blocks read while taken back", bad.Load())
		}
	}
}
