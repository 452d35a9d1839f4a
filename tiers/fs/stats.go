package fs

import (
	"sync/atomic"

	"github.com/kvtier/kvtier/offload"
)

// counters are updated by the workers without the tier mutex.
type counters struct {
	storeOK, storeFailed atomic.Uint64
	loadOK, loadFailed   atomic.Uint64
	blocksStored         atomic.Uint64
	blocksSkipped        atomic.Uint64
	blocksLoaded         atomic.Uint64
	bytesWritten         atomic.Uint64
	bytesRead            atomic.Uint64
	corrupt, foreign     atomic.Uint64
	transient, notFound  atomic.Uint64
	queueFull, full      atomic.Uint64
	cancelled            atomic.Uint64
	evictedBlocks        atomic.Uint64
	evictedBytes         atomic.Uint64
	tempRemoved          atomic.Uint64
}

// Stats is a snapshot of the tier's counters and gauges, for metrics.
type Stats struct {
	StoreJobs, StoreJobsFailed uint64
	LoadJobs, LoadJobsFailed   uint64
	// BlocksStored counts files written; BlocksSkipped blocks a store found
	// already on disk.
	BlocksStored, BlocksSkipped, BlocksLoaded uint64
	BytesWritten, BytesRead                   uint64
	// CorruptBlocks counts files that failed verification and were
	// deleted; ForeignBlocks files in the other format (refused, kept).
	CorruptBlocks, ForeignBlocks uint64
	// TransientErrors counts loads failed by an I/O error that did not
	// prove the file bad (the file is kept); NotFound loads of absent files.
	TransientErrors, NotFound uint64
	// QueueFull counts jobs refused because their pool's queue was full;
	// Full stores that could not make room under max_bytes; Cancelled
	// queued jobs withdrawn by the manager (CancelQueued).
	QueueFull, Full, Cancelled  uint64
	EvictedBlocks, EvictedBytes uint64
	// TempFilesRemoved counts leftover temp files removed (at start, or
	// later once they were stale_tmp_age old).
	TempFilesRemoved uint64
	// UsedBytes and Files describe the indexed files; MaxBytes is the
	// configured bound (0 = none).
	UsedBytes, MaxBytes int64
	// HighBytes and LowBytes are the watermarks in bytes (0 when
	// unbounded): eviction starts above HighBytes and stops at LowBytes.
	HighBytes, LowBytes int64
	Files               int
	Direct              bool
}

// Stats returns a snapshot.
func (t *Tier) Stats() Stats {
	t.mu.Lock()
	used, files := t.idx.used, t.idx.live
	t.mu.Unlock()
	c := &t.st
	return Stats{
		StoreJobs: c.storeOK.Load() + c.storeFailed.Load(), StoreJobsFailed: c.storeFailed.Load(),
		LoadJobs: c.loadOK.Load() + c.loadFailed.Load(), LoadJobsFailed: c.loadFailed.Load(),
		BlocksStored: c.blocksStored.Load(), BlocksSkipped: c.blocksSkipped.Load(), BlocksLoaded: c.blocksLoaded.Load(),
		BytesWritten: c.bytesWritten.Load(), BytesRead: c.bytesRead.Load(),
		CorruptBlocks: c.corrupt.Load(), ForeignBlocks: c.foreign.Load(),
		TransientErrors: c.transient.Load(), NotFound: c.notFound.Load(),
		QueueFull: c.queueFull.Load(), Full: c.full.Load(), Cancelled: c.cancelled.Load(),
		EvictedBlocks: c.evictedBlocks.Load(), EvictedBytes: c.evictedBytes.Load(),
		TempFilesRemoved: c.tempRemoved.Load(),
		UsedBytes:        used, MaxBytes: t.s.maxBytes, HighBytes: t.s.high, LowBytes: t.s.low, Files: files, Direct: t.direct,
	}
}

// Len returns the number of blocks the tier holds (its indexed files).
func (t *Tier) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idx.live
}

// Report implements offload.Reporter: the files the tier holds, their
// bytes, its evictions, and the corrupt blocks it read (it deletes every
// one).
func (t *Tier) Report() offload.TierReport {
	st := t.Stats()
	r := offload.TierReport{
		OccupancyBlocks: int64(st.Files), OccupancyBytes: st.UsedBytes, Evictions: st.EvictedBlocks,
		CorruptBlocks: st.CorruptBlocks, CorruptDeleted: st.CorruptBlocks,
	}
	t.mu.Lock()
	if sh := t.idx.sh; sh != nil {
		r.Shares = sh.t.Report(sh.used)
	}
	t.mu.Unlock()
	return r
}
