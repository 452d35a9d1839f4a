package workload

// ReferenceHitRate is the prefix hit rate of reqs replayed in order
// through a plain LRU cache of capacity blocks (0 = unbounded, the
// theoretical maximum): a request's hits are its leading ids present in
// the cache, after which every id of the request is inserted or
// refreshed in order, the last one most recent. This is the model behind
// the reference figures of the Mooncake trace's README, a baseline for
// Replay, whose primary differs in details (see BENCHMARKS.md, trace replay).
func ReferenceHitRate(reqs []Request, capacity int) float64 {
	c := newRefLRU(capacity)
	var hits, blocks uint64
	for _, r := range reqs {
		blocks += uint64(len(r.HashIDs))
		for _, id := range r.HashIDs {
			if !c.has(id) {
				break
			}
			hits++
		}
		for _, id := range r.HashIDs {
			c.use(id)
		}
	}
	if blocks == 0 {
		return 0
	}
	return float64(hits) / float64(blocks)
}

// refLRU is a map plus an intrusive doubly linked list over a node slice;
// head is the least recently used node.
type refLRU struct {
	capacity   int
	index      map[uint64]int32
	nodes      []refNode
	head, tail int32
}

type refNode struct {
	id         uint64
	prev, next int32
}

func newRefLRU(capacity int) *refLRU {
	return &refLRU{capacity: capacity, index: make(map[uint64]int32), head: -1, tail: -1}
}

func (c *refLRU) has(id uint64) bool {
	_, ok := c.index[id]
	return ok
}

// use makes id the most recently used entry, inserting it and evicting
// the least recently used entry when the cache is full.
func (c *refLRU) use(id uint64) {
	if i, ok := c.index[id]; ok {
		c.unlink(i)
		c.pushBack(i)
		return
	}
	var i int32
	if c.capacity > 0 && len(c.index) >= c.capacity {
		i = c.head // reuse the evicted node
		c.unlink(i)
		delete(c.index, c.nodes[i].id)
	} else {
		c.nodes = append(c.nodes, refNode{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i].id = id
	c.index[id] = i
	c.pushBack(i)
}

func (c *refLRU) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
}

func (c *refLRU) pushBack(i int32) {
	n := &c.nodes[i]
	n.prev, n.next = c.tail, -1
	if c.tail >= 0 {
		c.nodes[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
}
