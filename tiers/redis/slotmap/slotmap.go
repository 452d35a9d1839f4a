// Package slotmap routes keys over a Redis Cluster the way the cluster
// does: a key's slot is CRC16 (XMODEM) of the key — or of its hash tag,
// the part between the first '{' and the next '}' when that part is not
// empty — modulo 16384, and each slot belongs to one master.
//
// A Map is an immutable snapshot of the slot ranges the cluster reported
// (CLUSTER SLOTS); a router replaces it as a whole when the cluster
// changes, so readers never see half a map.
package slotmap

import "strings"

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// Slot returns the hash slot of key.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % Slots)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ table[byte(crc>>8)^s[i]]
	}
	return crc
}

var table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// Range is a run of slots and the address of the master that serves it.
type Range struct {
	Start, End int // inclusive, as CLUSTER SLOTS reports them
	Master     string
}

// Map is a slot → master snapshot. The zero value routes nothing.
type Map struct {
	owner   [Slots]uint16 // index into masters, plus one; 0: no master
	masters []string
}

// New builds the map of ranges. Slots outside every range (or in a range
// without a master) have no master; a range that is out of bounds is
// clipped, and a slot listed twice goes to the later range.
func New(ranges []Range) *Map {
	m := &Map{}
	idx := map[string]uint16{}
	for _, r := range ranges {
		if r.Master == "" {
			continue
		}
		i, ok := idx[r.Master]
		if !ok {
			m.masters = append(m.masters, r.Master)
			i = uint16(len(m.masters))
			idx[r.Master] = i
		}
		for s := max(r.Start, 0); s <= min(r.End, Slots-1); s++ {
			m.owner[s] = i
		}
	}
	return m
}

// Master returns the address of the master of key's slot, or "" when the
// slot has none (or m is nil).
func (m *Map) Master(key string) string {
	if m == nil {
		return ""
	}
	return m.MasterOf(Slot(key))
}

// MasterOf returns the master of slot, or "".
func (m *Map) MasterOf(slot int) string {
	if m == nil || slot < 0 || slot >= Slots {
		return ""
	}
	if i := m.owner[slot]; i > 0 {
		return m.masters[i-1]
	}
	return ""
}

// Masters returns the masters that serve at least one slot, in the order
// the ranges named them. The caller must not modify the slice.
func (m *Map) Masters() []string {
	if m == nil {
		return nil
	}
	return m.masters
}

// Covered reports how many slots have a master.
func (m *Map) Covered() int {
	if m == nil {
		return 0
	}
	n := 0
	for _, i := range m.owner {
		if i > 0 {
			n++
		}
	}
	return n
}
