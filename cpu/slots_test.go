package cpu

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// PinSlots and UnpinSlots are PrepareLoad and CompleteLoad by slot: the
// cascade path pins once by key and then per tier by slot.
func TestPinSlots(t *testing.T) {
	for _, pol := range policies {
		t.Run(pol, func(t *testing.T) {
			p := newPrimary(t, 4, pol)
			storeOK(t, p, 1, 2)
			if _, ok := p.PrepareStore(ks(3)); !ok { // 3 stays pending
				t.Fatal("prepare 3")
			}
			slots, err := p.PrepareLoad(ks(1, 2))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.PinSlots(slots); err != nil {
				t.Fatal(err)
			}
			for _, k := range []int{1, 2} {
				if ref, _ := p.RefCount(key(k)); ref != 2 {
					t.Fatalf("ref of %d = %d, want 2", k, ref)
				}
			}
			s3, _ := p.SlotOf(key(3))
			for _, tc := range []struct {
				slots []int64
				want  error
			}{
				{[]int64{slots[0], s3}, ErrNotReady},      // pending
				{[]int64{slots[0], 3}, ErrUnknownKey},     // never allocated
				{[]int64{slots[0], 4}, ErrSlotOutOfRange}, // past the arena
				{[]int64{-1}, ErrSlotOutOfRange},
			} {
				if err := p.PinSlots(tc.slots); !errors.Is(err, tc.want) {
					t.Errorf("PinSlots(%v) = %v, want %v", tc.slots, err, tc.want)
				}
			}
			// Three unpins of slot 0 when it holds two pins: nothing changes.
			if err := p.UnpinSlots([]int64{slots[0], slots[0], slots[0]}); !errors.Is(err, ErrNotPinned) {
				t.Fatalf("over-unpin = %v, want ErrNotPinned", err)
			}
			if err := p.UnpinSlots([]int64{s3}); !errors.Is(err, ErrNotPinned) {
				t.Fatalf("unpin pending = %v, want ErrNotPinned", err)
			}
			if err := p.UnpinSlots([]int64{99}); !errors.Is(err, ErrSlotOutOfRange) {
				t.Fatalf("unpin out of range = %v", err)
			}
			if ref, _ := p.RefCount(key(1)); ref != 2 {
				t.Fatalf("failed unpins changed ref of 1 to %d", ref)
			}
			if err := p.UnpinSlots(slots); err != nil {
				t.Fatal(err)
			}
			if err := p.CompleteLoad(ks(1, 2)); err != nil { // keys and slots mix
				t.Fatal(err)
			}
			if st := p.Stats(); st.Pinned != 0 || st.Evictable != 2 || st.Loads != 4 {
				t.Fatalf("stats %+v: want 0 pinned, 2 evictable, 4 loads", st)
			}
			checkInvariants(t, p)
		})
	}
}

// A slot unpinned by UnpinSlots becomes evictable as most recently used,
// like CompleteLoad: the order of last occurrences decides.
func TestUnpinSlotsOrder(t *testing.T) {
	p := newPrimary(t, 3, PolicyLRU)
	storeOK(t, p, 1, 2, 3)
	slots, err := p.PrepareLoad(ks(1, 2, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.UnpinSlots(slots); err != nil { // 1's last occurrence is last
		t.Fatal(err)
	}
	store(t, p, []int{4, 5}, []int{4, 5}, []int{1, 2}, []int{3, 2})
}

// PrepareStoreInto gives PrepareStore's results and reuses the caller's
// arrays; PrepareStore's own results are never overwritten by later calls.
func TestPrepareStoreInto(t *testing.T) {
	p := newPrimary(t, 4, PolicyLRU)
	q := newPrimary(t, 4, PolicyLRU)
	var into offload.PrepareStoreOutput
	var kept []offload.PrepareStoreOutput
	for i, batch := range [][]int{{1, 2, 3}, {3, 4, 5}, {6}, {6, 7, 8, 9}, {}} {
		want, wok := p.PrepareStore(ks(batch...))
		kept = append(kept, want)
		ok := q.PrepareStoreInto(ks(batch...), &into)
		if ok != wok || !slices.Equal(ids(into.KeysToStore), ids(want.KeysToStore)) ||
			!slices.Equal(into.Slots, want.Slots) || !slices.Equal(ids(into.Evicted), ids(want.Evicted)) {
			t.Fatalf("batch %d: into %v %+v, PrepareStore %v %+v", i, ok, into, wok, want)
		}
		p.CompleteStore(ks(batch...), true)
		q.CompleteStore(ks(batch...), true)
	}
	if got := ids(kept[0].KeysToStore); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("first PrepareStore output changed to %v", got)
	}
	// A rejected call leaves the output empty.
	pins, err := q.PrepareLoad(ks(6, 7, 8, 9))
	if err != nil {
		t.Fatal(err)
	}
	if q.PrepareStoreInto(ks(10), &into) || len(into.KeysToStore)+len(into.Slots)+len(into.Evicted) != 0 {
		t.Fatalf("rejected store: %+v", into)
	}
	if err := q.UnpinSlots(pins); err != nil {
		t.Fatal(err)
	}
}

// The last prepared batch short-cuts CompleteStore only for the keys it
// still holds: a batch completed as failed, whose slots were then given
// to other keys, must not be confused with them.
func TestCompleteStoreAfterSlotReuse(t *testing.T) {
	p := newPrimary(t, 2, PolicyLRU)
	if _, ok := p.PrepareStore(ks(1, 2)); !ok {
		t.Fatal("prepare")
	}
	p.CompleteStore(ks(1, 2), false) // slots freed, batch remembered
	storeOK(t, p, 3, 4)              // the same slots, other keys
	p.CompleteStore(ks(1, 2), true)  // absent: ignored
	lookups(t, p, map[int]offload.LookupResult{1: offload.Miss, 2: offload.Miss, 3: offload.Hit, 4: offload.Hit})
	checkInvariants(t, p)
}

// keyShapes are key layouts the index must spread: engine hashes (32 and
// 16 bytes), short ones, keys that differ only in their first or last
// bytes, only in the group, and long ones.
var keyShapes = []struct {
	name string
	key  func(i int) offload.Key
}{
	{"sha256", func(i int) offload.Key {
		h := sha256.Sum256(binary.AppendUvarint(nil, uint64(i)))
		return offload.MakeKey(h[:], 0)
	}},
	{"xxh128", func(i int) offload.Key {
		var h [16]byte
		binary.LittleEndian.PutUint64(h[:], uint64(i)*0x9e3779b97f4a7c15)
		return offload.MakeKey(h[:], 0)
	}},
	{"counter8", key},
	{"short", func(i int) offload.Key { return offload.Key(fmt.Sprint(i)) }},
	{"head-varies", func(i int) offload.Key {
		var h [40]byte
		binary.BigEndian.PutUint32(h[:], uint32(i))
		return offload.MakeKey(h[:], 7)
	}},
	{"middle-varies", func(i int) offload.Key {
		var h [32]byte
		binary.BigEndian.PutUint32(h[14:], uint32(i))
		return offload.MakeKey(h[:], 0)
	}},
	{"group-varies", func(i int) offload.Key { return offload.MakeKey(make([]byte, 32), uint32(i)) }},
	{"long", func(i int) offload.Key {
		h := make([]byte, 200)
		binary.BigEndian.PutUint32(h[100:], uint32(i))
		return offload.MakeKey(h, 0)
	}},
}

// Whatever the key layout, the index's probe runs stay short: the hash
// reads the whole key.
func TestIndexSpreadsKeyShapes(t *testing.T) {
	const n = 20_000
	for _, shape := range keyShapes {
		t.Run(shape.name, func(t *testing.T) {
			p, err := New(Config{SlotSize: 8, Capacity: 8 * n})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			keys := make([]offload.Key, n)
			for i := range keys {
				keys[i] = shape.key(i)
			}
			for i := 0; i < n; i += 100 {
				if _, ok := p.PrepareStore(keys[i : i+100]); !ok {
					t.Fatal("store")
				}
			}
			if st := p.Stats(); st.Blocks != n {
				t.Fatalf("%d blocks, want %d (keys not distinct?)", st.Blocks, n)
			}
			// Longest probe run: at load 2/5 with a uniform hash it is a
			// few dozen buckets; a hash that ignored the varying bytes
			// would give one run of n.
			idx := &p.b.index
			longest, run := 0, 0
			for i := range 2 * len(idx.b) { // twice round: runs wrap
				if idx.b[i%len(idx.b)].id >= 0 {
					run++
					longest = max(longest, run)
				} else {
					run = 0
				}
			}
			if longest > 100 {
				t.Fatalf("longest probe run %d buckets", longest)
			}
			for _, k := range keys {
				if p.Lookup(k) != offload.HitPending {
					t.Fatalf("lookup %x failed", k)
				}
			}
		})
	}
}

// Two primaries hash the same key differently: the seed is per instance,
// so colliding keys cannot be prepared in advance.
func TestHashSeedPerInstance(t *testing.T) {
	p, q := newPrimary(t, 1, PolicyLRU), newPrimary(t, 1, PolicyLRU)
	same := 0
	for i := range 8 {
		k := keyShapes[0].key(i)
		if p.b.hash(k) == q.b.hash(k) {
			same++
		}
	}
	if same > 0 {
		t.Fatalf("%d of 8 keys hash alike in two primaries", same)
	}
}
