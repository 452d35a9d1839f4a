package cpu

// ghostTable holds ARC's ghost lists B1 and B2 in one open-addressing
// (linear probing) table whose entries are also the list nodes: a ghost is
// a 31-bit identity, the list it is on and its two list links, 12 bytes in
// all, with no separate index. Entries move when a removal shifts its
// probe run back; their list neighbours are patched as they move.
//
// A ghost's identity is the low 32 bits of its key's hash (the slot's
// h32, so evicting a block needs no hashing), with bit 0 replaced by the
// list; keys whose tags agree in bits 1–31 share a ghost, which can at
// worst nudge ARC's target.
type ghostTable struct {
	e     []ghost
	n     uint64 // len(e)
	lists [2]glist
}

type ghost struct {
	id         uint32 // ghostID | list (bit 0); 0 marks an empty entry
	prev, next uint32 // positions of the older and newer ghost; noGhost at the ends
}

// glist is one ghost list, oldest at head.
type glist struct {
	head, tail uint32
	n          int
}

const noGhost = ^uint32(0)

var emptyGlist = glist{head: noGhost, tail: noGhost}

// ghostID returns the identity of the key whose hash tag is h32: never 0,
// bit 0 clear.
func ghostID(h32 uint32) uint32 {
	if id := h32 &^ 1; id != 0 {
		return id
	}
	return 2
}

// newGhostTable sizes the table for n ghosts at a load of at most 3/4.
func newGhostTable(n int) ghostTable {
	size := tableSize(n, 3, 4)
	g := ghostTable{e: make([]ghost, size), n: uint64(size)}
	g.clear()
	return g
}

func (g *ghostTable) clear() {
	clear(g.e)
	g.lists = [2]glist{emptyGlist, emptyGlist}
}

func (g *ghostTable) home(id uint32) uint32 { return uint32(uint64(id) * g.n >> 32) }

func (g *ghostTable) next(i uint32) uint32 {
	if i++; uint64(i) == g.n {
		return 0
	}
	return i
}

func (g *ghostTable) dist(a, b uint32) uint32 {
	if b >= a {
		return b - a
	}
	return b + uint32(g.n) - a
}

// find returns the position of the ghost with identity id, or noGhost.
func (g *ghostTable) find(id uint32) uint32 {
	for i := g.home(id); ; i = g.next(i) {
		e := g.e[i].id
		if e == 0 {
			return noGhost
		}
		if e&^1 == id {
			return i
		}
	}
}

// list returns the list (0 for B1, 1 for B2) of the ghost at i.
func (g *ghostTable) list(i uint32) int { return int(g.e[i].id & 1) }

// add appends a ghost with identity id (absent) at the newest end of list
// l. The caller guarantees room.
func (g *ghostTable) add(l int, id uint32) {
	i := g.home(id)
	for g.e[i].id != 0 {
		i = g.next(i)
	}
	g.e[i].id = id | uint32(l)
	g.pushBack(l, i)
}

func (g *ghostTable) pushBack(l int, i uint32) {
	gl := &g.lists[l]
	g.e[i].prev, g.e[i].next = gl.tail, noGhost
	if gl.tail != noGhost {
		g.e[gl.tail].next = i
	} else {
		gl.head = i
	}
	gl.tail = i
	gl.n++
}

func (g *ghostTable) unlink(i uint32) {
	gl := &g.lists[g.list(i)]
	p, n := g.e[i].prev, g.e[i].next
	if p != noGhost {
		g.e[p].next = n
	} else {
		gl.head = n
	}
	if n != noGhost {
		g.e[n].prev = p
	} else {
		gl.tail = p
	}
	gl.n--
}

// moveToBack makes the ghost at i the newest of its list.
func (g *ghostTable) moveToBack(i uint32) {
	l := g.list(i)
	if g.lists[l].tail == i {
		return
	}
	g.unlink(i)
	g.pushBack(l, i)
}

// remove deletes the ghost at i from its list and the table.
func (g *ghostTable) remove(i uint32) {
	g.unlink(i)
	// Backward-shift deletion, as in hashIndex.remove; a moved ghost's
	// neighbours (or its list's ends) follow it.
	hole, j := i, i
	for {
		j = g.next(j)
		e := g.e[j]
		if e.id == 0 {
			break
		}
		if g.dist(g.home(e.id&^1), j) >= g.dist(hole, j) {
			g.e[hole] = e
			gl := &g.lists[e.id&1]
			if e.prev != noGhost {
				g.e[e.prev].next = hole
			} else {
				gl.head = hole
			}
			if e.next != noGhost {
				g.e[e.next].prev = hole
			} else {
				gl.tail = hole
			}
			hole = j
		}
	}
	g.e[hole] = ghost{}
}
