package offload

import "sync/atomic"

// BlockClaimer is implemented by tiers that claim each block of a store
// job before they read its slot and release it once they no longer read
// it (Job.Claim, Job.Release). The manager may then take back a single
// block of such a job whether the job is queued or running, as long as no
// tier is reading that block at the moment: eviction gets the block where
// the primary alone would have evicted it, and the job goes on with its
// other blocks. A tier that does not declare this keeps every block of a
// started job until the job ends.
type BlockClaimer interface {
	ClaimsBlocks() bool
}

// Claims holds the per-block claim state shared by the store jobs of one
// cascade (one job per tier, over the same slots): how many tiers are
// reading each block now, and whether the manager has taken it back. A
// block taken back is never read again by any job of the cascade. Tiers
// use it through Job.Claim and Job.Release; the manager calls Revoke.
// It is safe for concurrent use. Each word holds the block's readers in
// its low bits and revokedBit once the block is taken back; a slice (one
// allocation per cascade) rather than a pointer to one.
type Claims []atomic.Uint32

const revokedBit = 1 << 31

// NewClaims returns the claims of a cascade of n blocks: none read, none
// taken back.
func NewClaims(n int) Claims { return make(Claims, n) }

// Revoke takes block i back unless a tier is reading it, and reports
// whether it did so now: false if a tier holds a claim on it, or if it
// was taken back before (see Revoked). After it returns true no tier
// reads the block's slot again, and Claim(i) reports false.
func (c Claims) Revoke(i int) bool {
	return c[i].CompareAndSwap(0, revokedBit)
}

// Revoked reports whether block i has been taken back.
func (c Claims) Revoked(i int) bool { return c[i].Load()&revokedBit != 0 }

func (c Claims) claim(i int) bool {
	for {
		v := c[i].Load()
		if v&revokedBit != 0 {
			return false
		}
		if c[i].CompareAndSwap(v, v+1) {
			return true
		}
	}
}

func (c Claims) release(i int) { c[i].Add(^uint32(0)) }

// Claim is what a tier that declares BlockClaimer calls before it reads
// the slot of Keys[i] in a store job. On false the manager has taken the
// block back: the tier must not read the slot, stores nothing for the key
// and does not announce it; the job still succeeds with its other blocks.
// On true the tier calls Release(i) as soon as it no longer reads the
// slot (its bytes are in the tier's own buffer, file or socket), whether
// the write succeeded or not. A job without Claims always reports true.
func (j *Job) Claim(i int) bool { return j.Claims == nil || j.Claims.claim(i) }

// Release ends the read Claim(i) began.
func (j *Job) Release(i int) {
	if j.Claims != nil {
		j.Claims.release(i)
	}
}
