package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"path/filepath"
	"strings"

	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// FindingKind classifies a file Check does not count as a good block.
type FindingKind uint8

const (
	// Corrupt is a block file that fails verification: wrong size, bad
	// trailer or checksum. A load would delete it; Repair does.
	Corrupt FindingKind = iota
	// Stray is a file that is not a block: a leftover temp file, a name
	// the layout never produces, a non-regular file. Repair removes it.
	Stray
	// Foreign is a block file in the other format or of another block
	// size (vLLM's own files in a shared directory). Loads refuse it and
	// leave it alone; so does Repair.
	Foreign
)

func (k FindingKind) String() string {
	return [...]string{"corrupt", "stray", "foreign"}[k]
}

// Finding is one file Check reports.
type Finding struct {
	Path   string
	Kind   FindingKind
	Reason string
	// Removed is set when Repair deleted the file.
	Removed bool
}

// CheckOptions tune Check.
type CheckOptions struct {
	// Repair removes corrupt and stray files.
	Repair bool
	// Progress, when set, is called after each file with the files
	// checked and the total.
	Progress func(done, total int)
}

// CheckReport is what Check found in one tier's directory.
type CheckReport struct {
	// Dir is the directory walked (the namespace's rank directory).
	Dir string
	// Files counts every file walked; Blocks the good block files among
	// them and Bytes their size.
	Files, Blocks int
	Bytes         int64
	Findings      []Finding
}

// Count returns the findings of kind k.
func (r *CheckReport) Count(k FindingKind) int {
	n := 0
	for _, f := range r.Findings {
		if f.Kind == k {
			n++
		}
	}
	return n
}

// Check verifies, offline, every file of the tier cfg describes: it takes
// the namespace directory's lock first, so it fails with an error wrapping
// dirlock.ErrLocked while a daemon (or another Check) holds the tier, and
// no daemon can start on it while it runs. Every block file is read in
// full and verified as a load would; with opts.Repair, corrupt and stray
// files are removed. A missing directory is an empty report.
func Check(ctx context.Context, cfg Config, opts CheckOptions) (*CheckReport, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, fmt.Errorf("fs tier %q: %w", cfg.Name, err)
	}
	lay, err := newLayout(s.root, s.ns, s.format)
	if err != nil {
		return nil, fmt.Errorf("fs tier %q: %w", s.name, err)
	}
	rep := &CheckReport{Dir: lay.rankDir}
	if _, err := s.fs.Stat(lay.rankDir); errors.Is(err, iofs.ErrNotExist) {
		return rep, nil
	}
	lock, err := dirlock.Acquire(lay.base, "kvtier fsck")
	if err != nil {
		return nil, fmt.Errorf("fs tier %q at %s: %w", s.name, lay.base, err)
	}
	defer lock.Release()

	var paths []string
	err = s.fs.WalkDir(lay.rankDir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			if p == lay.rankDir {
				return err
			}
			rep.Findings = append(rep.Findings, Finding{Path: p, Kind: Stray, Reason: "unreadable: " + err.Error()})
			if d != nil && d.IsDir() {
				return iofs.SkipDir
			}
			return nil
		}
		if !d.IsDir() {
			paths = append(paths, p)
		}
		return ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("fs tier %q: walk %s: %w", s.name, lay.rankDir, err)
	}
	buf := make([]byte, 0, s.format.fileSize(max(s.ns.BlockBytes, 0)))
	for i, p := range paths {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		rep.Files++
		f := checkFile(s, lay.rankDir, p, &buf)
		if f == nil {
			fi, _ := s.fs.Stat(p)
			rep.Blocks++
			if fi != nil {
				rep.Bytes += fi.Size()
			}
		} else {
			if opts.Repair && f.Kind != Foreign {
				if err := s.fs.Remove(p); err == nil || errors.Is(err, iofs.ErrNotExist) {
					f.Removed = true
				} else {
					f.Reason += "; not removed: " + err.Error()
				}
			}
			rep.Findings = append(rep.Findings, *f)
		}
		if opts.Progress != nil {
			opts.Progress(i+1, len(paths))
		}
	}
	return rep, nil
}

// checkFile verifies one file of the rank directory; nil means a good
// block.
func checkFile(s settings, root, p string, buf *[]byte) *Finding {
	if strings.HasSuffix(p, ".tmp") {
		return &Finding{Path: p, Kind: Stray, Reason: "temp file of an interrupted write"}
	}
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return &Finding{Path: p, Kind: Stray, Reason: err.Error()}
	}
	k, ok := filemapper.ParseRelPath(rel)
	if !ok {
		return &Finding{Path: p, Kind: Stray, Reason: "not a block file name of this layout"}
	}
	fi, err := s.fs.Stat(p)
	if err != nil {
		return &Finding{Path: p, Kind: Stray, Reason: err.Error()}
	}
	if !fi.Mode().IsRegular() {
		return &Finding{Path: p, Kind: Stray, Reason: "not a regular file"}
	}
	if err := verifyFile(s, k, p, fi.Size(), buf); err != nil {
		kind := Corrupt
		if errors.Is(err, ErrForeignFormat) {
			kind = Foreign
		} else if !errors.Is(err, ErrCorrupt) {
			kind = Stray // unreadable: an I/O error proves nothing about the bytes
		}
		return &Finding{Path: p, Kind: kind, Reason: err.Error()}
	}
	return nil
}

// verifyFile reads k's file (size bytes) whole and verifies it as a load
// would.
func verifyFile(s settings, k offload.Key, p string, size int64, buf *[]byte) error {
	n := int64(s.ns.BlockBytes)
	if n <= 0 {
		// The block size is unknown: in format kvtier the trailer says it.
		if n = size - s.format.fileSize(0); n < 0 {
			return fmt.Errorf("%w: %d bytes, shorter than a trailer", ErrCorrupt, size)
		}
	}
	if err := checkSize(s.format, size, n); err != nil {
		return err
	}
	f, err := s.fs.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if int64(cap(*buf)) < size {
		*buf = make([]byte, size)
	}
	b := (*buf)[:size]
	if m, err := f.ReadAt(b, 0); int64(m) != size {
		if err == nil || err == io.EOF {
			return fmt.Errorf("%w: short read (%d of %d bytes)", ErrCorrupt, m, size)
		}
		return err
	}
	if s.format == FormatKVTier {
		return verifyTrailer(b[n:], k, b[:n])
	}
	return nil
}

// checkSize judges a block file's size for a block of n bytes: a load and
// Check refuse the same files for the same reasons.
func checkSize(format Format, got, n int64) error {
	want := format.fileSize(int(n))
	if got == want {
		return nil
	}
	if format == FormatKVTier && got == n {
		return fmt.Errorf("%w: %d bytes without a kvtier trailer", ErrForeignFormat, got)
	}
	if format == FormatVLLM {
		// vLLM's directory has no block size in its name: another tier's
		// blocks, or a short file; neither is ours to delete.
		return fmt.Errorf("%w: file is %d bytes, this tier's blocks are %d (another block size in vLLM's directory, or a short file)", ErrForeignFormat, got, want)
	}
	return fmt.Errorf("%w: file is %d bytes, want %d", ErrCorrupt, got, want)
}
