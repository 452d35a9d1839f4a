package fs

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
)

// worker holds one pool goroutine's reusable aligned buffers.
type worker struct {
	t      *Tier
	bounce []byte // aligned, grown on demand
	tail   []byte // one aligned page for the trailer
	sum    chan uint64
}

func (w *worker) buffer(n int64) []byte {
	if int64(len(w.bounce)) < n {
		w.bounce = alignedBuf(int(n))
	}
	return w.bounce[:n]
}

// sumCh returns the worker's channel for a checksum computed alongside
// a write; one value is sent and received per use.
func (w *worker) sumCh() chan uint64 {
	if w.sum == nil {
		w.sum = make(chan uint64, 1)
	}
	return w.sum
}

func (w *worker) tailPage() []byte {
	if w.tail == nil {
		w.tail = alignedBuf(align)
	}
	return w.tail
}

// slots resolves and checks a job's slots before any I/O.
func (t *Tier) slots(job *offload.Job) ([][]byte, error) {
	if len(job.Keys) != len(job.Slots) {
		return nil, fmt.Errorf("%w: %d keys, %d slots", ErrBadJob, len(job.Keys), len(job.Slots))
	}
	if len(job.Keys) == 0 {
		return nil, nil
	}
	if job.Arena == nil {
		return nil, fmt.Errorf("%w: no arena", ErrBadJob)
	}
	if bb := t.s.ns.BlockBytes; bb > 0 && job.Arena.SlotSize() != bb {
		return nil, fmt.Errorf("%w: arena slot size %d, namespace block_bytes %d", ErrBadJob, job.Arena.SlotSize(), bb)
	}
	out := make([][]byte, len(job.Keys))
	for i, k := range job.Keys {
		if !k.Valid() {
			return nil, fmt.Errorf("%w: key %d has %d bytes", ErrBadJob, i, len(k))
		}
		b, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return nil, fmt.Errorf("fs tier: slot %d of key %s: %w", job.Slots[i], k, err)
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("%w: empty slot %d", ErrBadJob, job.Slots[i])
		}
		out[i] = b
	}
	return out, nil
}

// store runs a store (cascade) job: each block not already on disk is
// written to a temp file and renamed into place. The first failure fails
// the job (blocks written before it stay); success emits one stored
// event with the job's keys in order, less any the job itself evicted.
//
// start is the job's submission time: its reported duration includes the
// wait in the queue, which is what admission must see.
func (w *worker) store(job *offload.Job, start time.Time) {
	t := w.t
	if t.hookStoreStart != nil {
		t.hookStoreStart()
	}
	slots, err := t.slots(job)
	if err != nil {
		t.fail(job, true, nil, err, start)
		return
	}
	var bytes int64
	var batch []written // fsync batch: written, not yet synced and renamed
	for i, k := range job.Keys {
		if t.closing.Load() {
			err = ErrClosed
			break
		}
		var wr written
		if wr, err = w.storeBlock(job, i, slots[i]); err != nil {
			err = fmt.Errorf("fs tier: store %s: %w", k, err)
			break
		}
		if wr.tmp != "" {
			batch = append(batch, wr)
		}
		bytes += wr.size
	}
	if len(batch) > 0 {
		if err == nil {
			err = t.commitBatch(batch)
		} else {
			t.abandon(batch)
		}
	}
	t.lookups.Forget(job.Keys)
	if err != nil {
		t.fail(job, true, nil, err, start)
		return
	}
	t.mu.Lock()
	if t.s.events {
		// A block of this job may be gone again (evicted to make room for a
		// later block of the job, or discarded by a load) and its removal
		// already buffered: announcing it now would leave routers believing
		// in it. Blocks still evicting are announced; their removal follows.
		t.emitLocked(t.idx.mapped(job.Keys), false)
	}
	t.mu.Unlock()
	t.st.storeOK.Add(1)
	t.finish(offload.JobResult{JobID: job.ID, Success: true, Bytes: bytes, Duration: time.Since(start)})
}

// written is a block file written to its temp name. With fsync batch
// the rename waits for the job's other blocks and one sync of them all;
// otherwise tmp is "" (the file is in place) and size is what it added.
type written struct {
	k         offload.Key
	tmp, dest string
	size      int64
}

// storeBlock writes block i of job unless its file exists or the
// manager has taken the block back (offload.Job.Claim): the slot is read
// only between the claim and its release.
func (w *worker) storeBlock(job *offload.Job, i int, payload []byte) (written, error) {
	t := w.t
	k := job.Keys[i]
	dest := t.lay.path(k)
	t.mu.Lock()
	for {
		e, ok := t.idx.find(k)
		if !ok {
			break
		}
		if t.idx.ents[e].state == stateLive {
			t.mu.Unlock()
			t.st.blocksSkipped.Add(1)
			return written{}, nil
		}
		// Being evicted: wait for the unlink so that our rename cannot be
		// deleted by it.
		t.evictCond.Wait()
	}
	t.mu.Unlock()
	if _, ok := t.adopt(k); ok { // written by another process (or vLLM) already
		t.st.blocksSkipped.Add(1)
		return written{}, nil
	}
	size := t.s.format.fileSize(len(payload))
	if err := t.reserve(k, size); err != nil {
		return written{}, err
	}
	tmp, err := w.writeFile(job, i, dest, payload)
	if tmp == "" { // failed, or taken back (err nil)
		t.unreserve(size)
		return written{}, err
	}
	wr := written{k: k, tmp: tmp, dest: dest, size: size}
	if t.s.fsync == fsyncBatch {
		return wr, nil
	}
	if err := t.s.fs.Rename(tmp, dest); err != nil {
		_ = t.s.fs.Remove(tmp)
		t.unreserve(size)
		return written{}, err
	}
	t.committed(k, size)
	wr.tmp = ""
	return wr, nil
}

// committed indexes a block file now in place.
func (t *Tier) committed(k offload.Key, size int64) {
	t.mu.Lock()
	if t.s.maxBytes > 0 {
		t.reserved -= size
	}
	if _, ok := t.idx.find(k); !ok {
		t.idx.insert(k, size)
	}
	t.mu.Unlock()
	t.st.blocksStored.Add(1)
	t.st.bytesWritten.Add(uint64(size))
}

// commitBatch makes a job's temp files durable with one syncfs (one fsync
// per file where the filesystem cannot) and renames them into place.
func (t *Tier) commitBatch(batch []written) error {
	if err := t.syncBatch(batch); err != nil {
		t.abandon(batch)
		return fmt.Errorf("fs tier: fsync batch of %d blocks: %w", len(batch), err)
	}
	for i, wr := range batch {
		if err := t.s.fs.Rename(wr.tmp, wr.dest); err != nil {
			t.abandon(batch[i:])
			return fmt.Errorf("fs tier: store %s: %w", wr.k, err)
		}
		t.committed(wr.k, wr.size)
	}
	return nil
}

func (t *Tier) syncBatch(batch []written) error {
	if s, ok := t.s.fs.(vfs.SyncFS); ok {
		err := s.SyncFS(t.lay.rankDir)
		if err == nil || !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
	}
	for _, wr := range batch {
		f, err := t.s.fs.OpenFile(wr.tmp, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// abandon removes temp files that will not be renamed and returns their
// reservations.
func (t *Tier) abandon(batch []written) {
	for _, wr := range batch {
		_ = t.s.fs.Remove(wr.tmp)
		t.unreserve(wr.size)
	}
}

// writeFile writes payload, block i of job (and the trailer), to a temp
// file next to dest and returns its name; with fsync block the file is
// synced before it is closed. On any error the temp file is removed. It
// returns "" and no error when the manager took the block back.
func (w *worker) writeFile(job *offload.Job, i int, dest string, payload []byte) (tmp string, err error) {
	t := w.t
	fs := t.s.fs
	tmp = dest + t.tmpPrefix + strconv.FormatUint(t.tmpSeq.Add(1), 36) + ".tmp"
	flag := os.O_CREATE | os.O_EXCL | os.O_WRONLY
	if t.direct {
		flag |= oDirect
	}
	// The slot is read from the claim to the end of the write (the sync
	// after it reads the page cache or the device, not the slot).
	if !job.Claim(i) {
		return "", nil
	}
	f, err := t.openTemp(tmp, flag)
	if err != nil {
		job.Release(i)
		return "", err
	}
	werr := w.writeBlock(f, job.Keys[i], payload)
	job.Release(i)
	if werr == nil && t.s.fsync == fsyncBlock {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = fs.Remove(tmp)
		return "", werr
	}
	return tmp, nil
}

// writeBlock writes the file contents. With O_DIRECT the aligned bulk
// of the file (the whole block when the slot is aligned and its size a
// multiple of the alignment) is written directly, from the slot in place
// or from the worker's aligned bounce buffer, and the unaligned rest (the
// 24-byte trailer) through the page cache after turning O_DIRECT off on
// the descriptor. Padding the rest to a page and truncating the file back
// instead costs a journaled size change per block, about a third of a
// 2 MiB write's time with 8 writers; it remains the fallback where
// O_DIRECT cannot be turned off.
func (w *worker) writeBlock(f vfs.File, k offload.Key, payload []byte) error {
	t := w.t
	n := int64(len(payload))
	size := t.s.format.fileSize(len(payload))
	withTrailer := t.s.format == FormatKVTier
	if !t.direct {
		if _, err := f.WriteAt(payload, 0); err != nil {
			return err
		}
		if withTrailer {
			tr := w.tailPage()[:trailerLen]
			putTrailer(tr, k, payload)
			if _, err := f.WriteAt(tr, n); err != nil {
				return err
			}
		}
		return nil
	}
	// head is written with O_DIRECT at offset 0, tail right after it;
	// padded is tail followed by zeros up to the alignment.
	var head, tail, padded []byte
	var sum chan uint64
	if isAligned(payload) {
		head = payload
		if withTrailer {
			padded = w.tailPage()
			clear(padded)
			tail = padded[:trailerLen]
			// The checksum (~0.1 ms for 2 MiB) runs on another core while
			// this goroutine's thread sits in the payload write.
			sum = w.sumCh()
			go func() { sum <- checksum(k, payload) }()
		}
	} else {
		buf := w.buffer(roundUp(size))
		copy(buf, payload)
		if withTrailer {
			putTrailer(buf[n:size], k, payload)
		}
		clear(buf[size:])
		h := size &^ (align - 1)
		head, tail, padded = buf[:h], buf[h:size], buf[h:]
	}
	if len(head) > 0 {
		_, err := f.WriteAt(head, 0)
		if sum != nil {
			putTrailerSum(padded, len(payload), <-sum)
		}
		if err != nil {
			return err
		}
	}
	if len(tail) == 0 {
		return nil
	}
	off := int64(len(head))
	if f.SetDirect(false) == nil {
		_, err := f.WriteAt(tail, off)
		return err
	}
	if _, err := f.WriteAt(padded, off); err != nil {
		return err
	}
	return f.Truncate(size)
}

// load runs a promotion job: blocks are read into their slots in order
// and verified. A block that fails (corrupt, foreign, gone, an I/O error)
// fails alone: the others are still loaded, SuccessfulKeys lists them,
// and the failed keys answer Miss for the requests that looked them up.
// Closing the tier stops the job after its current block.
func (w *worker) load(job *offload.Job, start time.Time) {
	t := w.t
	slots, err := t.slots(job)
	if err != nil {
		t.fail(job, false, nil, err, start)
		return
	}
	var bytes int64
	var ok, failed []offload.Key
	var firstErr error
	for i, k := range job.Keys {
		if t.closing.Load() {
			if ok == nil {
				ok = append(make([]offload.Key, 0, i), job.Keys[:i]...)
			}
			failed = append(failed, job.Keys[i:]...)
			firstErr = cmp.Or(firstErr, error(ErrClosed))
			break
		}
		if err := w.loadBlock(k, slots[i]); err != nil {
			failed = append(failed, k)
			firstErr = cmp.Or(firstErr, fmt.Errorf("fs tier: load %s: %w", k, err))
			if ok == nil {
				ok = append(make([]offload.Key, 0, len(job.Keys)), job.Keys[:i]...)
			}
			continue
		}
		if ok != nil {
			ok = append(ok, k)
		}
		bytes += int64(len(slots[i]))
	}
	if len(failed) > 0 {
		t.lookups.MarkMiss(failed)
		if len(failed) > 1 {
			firstErr = fmt.Errorf("%w (and %d more blocks of the job)", firstErr, len(failed)-1)
		}
		if len(ok) == 0 {
			ok = nil
		}
		t.st.loadFailed.Add(1)
		t.finish(offload.JobResult{JobID: job.ID, SuccessfulKeys: ok, Bytes: bytes, Duration: time.Since(start), Err: firstErr})
		return
	}
	t.st.loadOK.Add(1)
	t.finish(offload.JobResult{JobID: job.ID, Success: true, Bytes: bytes, Duration: time.Since(start)})
}

// loadBlock reads and verifies k's file into slot. Verified corruption
// deletes the file; I/O errors that prove nothing leave it.
func (w *worker) loadBlock(k offload.Key, slot []byte) error {
	t := w.t
	t.mu.Lock()
	i, ok := t.idx.acquire(k)
	t.mu.Unlock()
	if !ok {
		if _, ok := t.adopt(k); !ok {
			t.st.notFound.Add(1)
			return fmt.Errorf("block not stored: %w", iofs.ErrNotExist)
		}
		t.mu.Lock()
		i, ok = t.idx.acquire(k)
		t.mu.Unlock()
		if !ok {
			t.st.notFound.Add(1)
			return fmt.Errorf("block not stored: %w", iofs.ErrNotExist)
		}
	}
	defer func() {
		t.mu.Lock()
		t.idx.done(i)
		t.mu.Unlock()
	}()
	if t.hookAcquired != nil {
		t.hookAcquired(k)
	}
	err := w.readFile(k, t.lay.path(k), slot)
	switch {
	case err == nil:
		t.st.blocksLoaded.Add(1)
		t.st.bytesRead.Add(uint64(len(slot)))
	case errors.Is(err, ErrCorrupt):
		t.st.corrupt.Add(1)
		t.s.logger.Warn("corrupt block file deleted", "key", k.String(), "err", err)
		t.discard(i, k, true)
	case errors.Is(err, ErrForeignFormat):
		t.st.foreign.Add(1)
	case errors.Is(err, iofs.ErrNotExist):
		t.st.notFound.Add(1)
		t.discard(i, k, false) // deleted behind our back
	default:
		t.st.transient.Add(1)
	}
	return err
}

// readFile reads k's file into slot and verifies it.
func (w *worker) readFile(k offload.Key, name string, slot []byte) error {
	t := w.t
	flag := os.O_RDONLY
	if t.direct {
		flag |= oDirect
	}
	f, err := t.s.fs.OpenFile(name, flag, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	n := int64(len(slot))
	want := t.s.format.fileSize(len(slot))
	if err := checkSize(t.s.format, fi.Size(), n); err != nil {
		return err
	}
	withTrailer := t.s.format == FormatKVTier
	if !t.direct || isAligned(slot) {
		if err := readFull(f, slot, 0); err != nil {
			return err
		}
		if !withTrailer {
			return nil
		}
		page := w.tailPage()
		if !t.direct {
			page = page[:trailerLen]
		}
		m, err := f.ReadAt(page, n)
		if err != nil && err != io.EOF {
			return err
		}
		if m != trailerLen {
			return fmt.Errorf("%w: short trailer read (%d bytes)", ErrCorrupt, m)
		}
		return verifyTrailer(page[:trailerLen], k, slot)
	}
	buf := w.buffer(roundUp(want))
	m, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return err
	}
	if int64(m) != want {
		return fmt.Errorf("%w: short read (%d of %d bytes)", ErrCorrupt, m, want)
	}
	if withTrailer {
		if err := verifyTrailer(buf[n:want], k, buf[:n]); err != nil {
			return err
		}
	}
	copy(slot, buf[:n])
	return nil
}

// readFull reads len(b) bytes at off; running out of file is corruption
// (the size was checked just before), other errors are returned as is.
func readFull(f vfs.File, b []byte, off int64) error {
	m, err := f.ReadAt(b, off)
	if m == len(b) {
		return nil
	}
	if err == nil || err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: short read (%d of %d bytes)", ErrCorrupt, m, len(b))
	}
	return err
}
