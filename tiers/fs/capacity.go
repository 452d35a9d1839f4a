package fs

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

// reserve makes room for a file of size bytes before it is written. Over
// the high watermark it evicts least-recently-used files (never one being
// read) down to the low watermark; it fails with ErrFull when even then
// the file would not fit under max_bytes.
func (t *Tier) reserve(k offload.Key, size int64) error {
	if t.s.maxBytes == 0 {
		return nil
	}
	t.mu.Lock()
	need := t.idx.used + t.reserved + size
	if need <= t.s.high {
		t.reserved += size
		t.mu.Unlock()
		return nil
	}
	victims, _ := t.idx.pickVictims(need-t.s.low, t.idx.storerOf(k))
	t.reserved += size // claim now so concurrent writers see it
	t.mu.Unlock()

	t.evict(victims)

	t.mu.Lock()
	defer t.mu.Unlock()
	if t.idx.used+t.reserved > t.s.maxBytes {
		t.reserved -= size
		t.st.full.Add(1)
		return ErrFull
	}
	return nil
}

// unreserve returns a reservation of a store that failed.
func (t *Tier) unreserve(size int64) {
	if t.s.maxBytes == 0 {
		return
	}
	t.mu.Lock()
	t.reserved -= size
	t.mu.Unlock()
}

// evict deletes the files of entries marked evicting, then unmaps them
// and emits one removed event for the batch, and returns how many it
// removed. A file that cannot be deleted (other than already gone) goes
// back to the LRU end.
func (t *Tier) evict(victims []int32) int {
	if len(victims) == 0 {
		return 0
	}
	t.mu.Lock()
	keys := make([]offload.Key, len(victims))
	for n, i := range victims {
		keys[n] = t.idx.ents[i].key
	}
	t.mu.Unlock()

	errs := make([]error, len(keys))
	for n, k := range keys {
		if t.hookEvicting != nil {
			t.hookEvicting(k)
		}
		if err := t.s.fs.Remove(t.lay.path(k)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			errs[n] = err
		}
	}

	t.mu.Lock()
	removed := keys[:0:0]
	var bytes int64
	for n, i := range victims {
		if errs[n] != nil {
			t.idx.unevict(i)
			continue
		}
		bytes += int64(t.idx.ents[i].size)
		removed = append(removed, keys[n])
		t.idx.drop(i)
	}
	t.emitLocked(removed, true)
	t.evictCond.Broadcast()
	t.mu.Unlock()

	for _, err := range errs {
		if err != nil {
			t.s.logger.Warn("eviction: cannot delete block file", "err", err)
			break
		}
	}
	t.st.evictedBlocks.Add(uint64(len(removed)))
	t.st.evictedBytes.Add(uint64(bytes))
	t.lookups.Forget(removed)
	return len(removed)
}

// Delete removes the files of keys the tier holds, and announces their
// removal (tiering.Deleter); it returns how many it removed. A file being
// read is left (counted in neither); a file the index does not know (one
// another process wrote) is deleted too.
func (t *Tier) Delete(_ context.Context, keys []offload.Key) (int, error) {
	var victims []int32
	var unknown []offload.Key
	t.mu.Lock()
	for _, k := range keys {
		if !k.Valid() {
			continue
		}
		i, ok := t.idx.find(k)
		if !ok {
			unknown = append(unknown, k)
			continue
		}
		if e := &t.idx.ents[i]; e.state == stateLive && e.readers == 0 {
			t.idx.unlink(i)
			t.idx.live--
			e.state = stateEvicting
			victims = append(victims, i)
		}
	}
	t.mu.Unlock()
	n := t.evict(victims)
	var gone []offload.Key
	for _, k := range unknown {
		if err := t.s.fs.Remove(t.lay.path(k)); err == nil {
			gone = append(gone, k)
		}
	}
	if len(gone) > 0 {
		t.mu.Lock()
		t.emitLocked(gone, true)
		t.mu.Unlock()
		t.lookups.Forget(gone)
	}
	return n + len(gone), nil
}

// Keep passes over the blocks keep reports when the tier evicts
// (offload.Keeper: routers' pins).
func (t *Tier) Keep(keep func(offload.Key) bool) {
	t.mu.Lock()
	t.idx.keep = keep
	t.mu.Unlock()
}

// evictToLow evicts down to the low watermark when usage is above the
// high one (after the start-up scan).
func (t *Tier) evictToLow() {
	if t.s.maxBytes == 0 {
		return
	}
	t.mu.Lock()
	if t.idx.used <= t.s.high {
		t.mu.Unlock()
		return
	}
	victims, _ := t.idx.pickVictims(t.idx.used-t.s.low, -1)
	t.mu.Unlock()
	t.evict(victims)
}

// discard removes k's file after it failed verification or vanished:
// unmapped at once (readers in progress keep their descriptors), deleted
// when corrupt, announced with a removed event. The caller (a failed
// load) marks the key Miss in the lookup cache, which also drops the
// shared verdict.
func (t *Tier) discard(i int32, k offload.Key, deleteFile bool) {
	t.mu.Lock()
	if j, ok := t.idx.find(k); ok && j == i && t.idx.ents[i].state == stateLive {
		t.idx.drop(i)
		t.emitLocked([]offload.Key{k}, true)
	}
	t.mu.Unlock()
	if deleteFile {
		if err := t.s.fs.Remove(t.lay.path(k)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			t.s.logger.Warn("cannot delete corrupt block file", "key", k.String(), "err", err)
		}
	}
}

// DescribeCapacity says, for a log line, how much the tier holds and may
// hold.
func (t *Tier) DescribeCapacity() string {
	st := t.Stats()
	if st.MaxBytes == 0 {
		return fmt.Sprintf("unbounded (%d blocks, %s on disk)", st.Files, confvalue.ByteSize(st.UsedBytes))
	}
	return fmt.Sprintf("%s (%d blocks, %s used; evicts above %s down to %s)", confvalue.ByteSize(st.MaxBytes), st.Files,
		confvalue.ByteSize(st.UsedBytes), confvalue.ByteSize(st.HighBytes), confvalue.ByteSize(st.LowBytes))
}
