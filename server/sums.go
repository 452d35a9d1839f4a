package server

import "sync"

// blockSums remembers the block stream's checksum (blockstream.Sum) of
// blocks of a namespace's primary by slot and the slot's generation
// (Manager.SlotGen), so that a block sent before, or one that arrived on
// the stream, goes out again without being hashed: on this 2-core machine
// the sender's hashing was about a tenth of a get's time. A slot's bytes
// change only when it is given another block, which has another
// generation, so an entry vouches for other bytes only if the slot took a
// multiple of 65 536 blocks (the generation's range) with no get in
// between; even then the receiver, which verifies every block whatever
// the sender did, drops the block as corrupt: a miss, never wrong bytes.
// Safe for concurrent use: the stream's senders use it without the
// namespace's lock.
type blockSums struct {
	mu sync.Mutex
	e  []sumEntry // by slot
}

type sumEntry struct {
	gen uint16
	ok  bool
	sum uint64
}

func newBlockSums(slots int) *blockSums { return &blockSums{e: make([]sumEntry, slots)} }

// get returns the sum of slot's block of generation gen, if known.
func (c *blockSums) get(slot int64, gen uint16) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slot < 0 || slot >= int64(len(c.e)) {
		return 0, false
	}
	e := c.e[slot]
	return e.sum, e.ok && e.gen == gen
}

// put remembers sum as that of slot's block of generation gen.
func (c *blockSums) put(slot int64, gen uint16, sum uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slot >= 0 && slot < int64(len(c.e)) {
		c.e[slot] = sumEntry{gen: gen, ok: true, sum: sum}
	}
}
