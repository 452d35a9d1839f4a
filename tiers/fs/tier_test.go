package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

const bs = 8192 // block size of most tests: two pages, so O_DIRECT works in place

func results(rs ...offload.LookupResult) []offload.LookupResult { return rs }

// Case 63: an empty tier answers Retry first, then Miss.
func TestCase63EmptyLookups(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	r := req("r")
	if got := tier.Lookup(k(1), r); got != offload.Retry {
		t.Fatalf("first lookup = %v, want RETRY", got)
	}
	if !tier.HasPendingWork() {
		t.Fatal("HasPendingWork = false with a queued existence check")
	}
	if got := lookupAll(t, tier, r, k(1), k(2)); !slices.Equal(got, results(offload.Miss, offload.Miss)) {
		t.Fatalf("lookups = %v, want MISS MISS", got)
	}
	if tier.HasPendingWork() {
		t.Fatal("HasPendingWork = true after the verdicts landed")
	}
}

// Case 64: store one key; it is found and its file is where vLLM puts it.
func TestCase64StoreOne(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 4, true)
	a.fill(0, 1)
	res := run(t, tier, false, a, req("r"), []offload.Key{k(1)}, []int64{0})
	if !res.Success || res.Err != nil {
		t.Fatalf("store failed: %+v", res)
	}
	if got := lookupAll(t, tier, req("r"), k(1)); got[0] != offload.Hit {
		t.Fatalf("lookup = %v, want HIT", got[0])
	}
	fi, err := os.Stat(tier.Path(k(1)))
	if err != nil {
		t.Fatalf("block file: %v", err)
	}
	if fi.Size() != bs+trailerLen {
		t.Fatalf("file size %d, want %d", fi.Size(), bs+trailerLen)
	}
	// Path follows §5.1 exactly.
	hexh := k(1).HexHash()
	want := filepath.Join(tier.lay.rankDir, hexh[:3], hexh[3:5]+"_g1", hexh+".bin")
	if tier.Path(k(1)) != want {
		t.Fatalf("path %s, want %s", tier.Path(k(1)), want)
	}
	if !strings.HasSuffix(tier.lay.rankDir, "_r0") || !strings.Contains(tier.lay.base, "org_model_") {
		t.Fatalf("rank dir %s", tier.lay.rankDir)
	}
	if _, err := os.Stat(tier.ConfigPath()); err != nil {
		t.Fatalf("config.json: %v", err)
	}
}

// Case 65: store two, load them into other slots; files remain, still HIT.
func TestCase65StoreLoad(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 4, true)
	a.fill(0, 10)
	a.fill(1, 11)
	keys := []offload.Key{k(1), k(2)}
	if res := run(t, tier, false, a, req("r"), keys, []int64{0, 1}); !res.Success {
		t.Fatalf("store: %+v", res)
	}
	res := run(t, tier, true, a, req("r"), keys, []int64{2, 3})
	if !res.Success || res.Bytes != 2*bs {
		t.Fatalf("load: %+v", res)
	}
	if !bytes.Equal(a.slot(0), a.slot(2)) || !bytes.Equal(a.slot(1), a.slot(3)) {
		t.Fatal("loaded bytes differ from stored bytes")
	}
	for _, key := range keys {
		if _, err := os.Stat(tier.Path(key)); err != nil {
			t.Fatalf("file gone after load: %v", err)
		}
	}
	if got := lookupAll(t, tier, req("r2"), keys...); !slices.Equal(got, results(offload.Hit, offload.Hit)) {
		t.Fatalf("lookups after load = %v", got)
	}
}

// Case 66: an unwritable root and a bad locality fail construction.
func TestCase66StartupErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	readOnly := vfstest.NewInjector(vfs.OS(), func(op vfstest.Op, _ string) *vfstest.Fault {
		if op == vfstest.OpCreate || op == vfstest.OpMkdir {
			return &vfstest.Fault{Err: syscall.EROFS}
		}
		return nil
	})
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"root is a file", func(c *Config) { c.RootDir = filepath.Join(file, "sub") }, "not writable"},
		{"read-only filesystem", func(c *Config) { c.FS = readOnly }, "not writable"},
		{"bad locality", func(c *Config) { c.Locality = "nearby" }, `"nearby"`},
		{"global is not a config locality", func(c *Config) { c.Locality = "global" }, `"global"`},
		{"no root", func(c *Config) { c.RootDir = "" }, "root_dir"},
		{"bad format", func(c *Config) { c.Format = "raw" }, `"raw"`},
		{"bad o_direct", func(c *Config) { c.ODirect = "maybe" }, `"maybe"`},
		{"bad watermarks", func(c *Config) { c.HighWatermark, c.LowWatermark = 0.5, 0.9 }, "low_watermark"},
		{"no model", func(c *Config) { c.Namespace.ModelName = "" }, "model_name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(testConfig(t.TempDir(), tc.mod))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error = %v, want one mentioning %s", err, tc.want)
			}
		})
	}
}

// Case 67: locality from config, case-insensitive. Unset is local, where
// vLLM leaves it unspecified (dynamic): a request asking for remote tiers
// only must not load from this host's disk (issue 12).
func TestCase67Locality(t *testing.T) {
	for in, want := range map[string]offload.Locality{
		"LOCAL": offload.LocalityLocal, "local": offload.LocalityLocal,
		"Remote": offload.LocalityRemote, "": offload.LocalityLocal,
	} {
		tier := newTier(t, t.TempDir(), func(c *Config) { c.Locality = in })
		if tier.Locality() != want || tier.Medium() != offload.MediumStorage || tier.Type() != "fs" || tier.Name() != "fs0" {
			t.Fatalf("locality %q: got %v/%v/%s/%s", in, tier.Medium(), tier.Locality(), tier.Type(), tier.Name())
		}
	}
}

// Case 68: loading a missing file fails; one missing key fails the job.
func TestCase68LoadMissing(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 4, true)
	if res := run(t, tier, true, a, req("r"), []offload.Key{k(1)}, []int64{0}); res.Success || !errors.Is(res.Err, os.ErrNotExist) {
		t.Fatalf("load of a missing key: %+v", res)
	}
	run(t, tier, false, a, req("r"), []offload.Key{k(1)}, []int64{0})
	res := run(t, tier, true, a, req("r"), []offload.Key{k(1), k(2)}, []int64{1, 2})
	if res.Success {
		t.Fatalf("load with a missing key succeeded: %+v", res)
	}
	if !slices.Equal(res.SuccessfulKeys, []offload.Key{k(1)}) {
		t.Fatalf("SuccessfulKeys = %v, want [k1]", res.SuccessfulKeys)
	}
}

// Case 69: two store jobs, two results with their ids, both keys found.
func TestCase69TwoStores(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 4, true)
	tier.SubmitStore(&offload.Job{ID: 101, Keys: []offload.Key{k(1)}, Slots: []int64{0}, Arena: a})
	tier.SubmitStore(&offload.Job{ID: 102, Keys: []offload.Key{k(2)}, Slots: []int64{1}, Arena: a})
	res := collect(t, tier, 2)
	ids := []uint64{res[0].JobID, res[1].JobID}
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{101, 102}) || !res[0].Success || !res[1].Success {
		t.Fatalf("results %+v", res)
	}
	if got := lookupAll(t, tier, req("r"), k(1), k(2)); !slices.Equal(got, results(offload.Hit, offload.Hit)) {
		t.Fatalf("lookups = %v", got)
	}
}

// Case 70: data round trip for batches of 0, 1, 2 and 5 blocks, in both
// formats, with and without O_DIRECT, with aligned and misaligned slots
// and a block size that is not a multiple of the page.
func TestCase70RoundTrip(t *testing.T) {
	for _, format := range []string{"kvtier", "vllm"} {
		// "padded": O_DIRECT cannot be turned off for the unaligned tail, so
		// the writer pads it and truncates the file back.
		for _, direct := range []string{"auto", "off", "padded"} {
			for _, size := range []int{bs, 3000, 5000} {
				for _, aligned := range []bool{true, false} {
					name := strings.Join([]string{format, direct, map[bool]string{true: "aligned", false: "misaligned"}[aligned]}, "/")
					t.Run(name+"/"+string(rune('0'+size/1000)), func(t *testing.T) {
						refuse := vfstest.NewInjector(vfs.OS(), vfstest.On(vfstest.OpSetDirect, "", vfstest.Fault{Err: syscall.EINVAL}))
						tier := newTier(t, t.TempDir(), func(c *Config) {
							c.Format, c.ODirect = format, direct
							if direct == "padded" {
								c.ODirect, c.FS = "auto", refuse
							}
						})
						a := newArena(size, 20, aligned)
						next := 0
						for _, n := range []int{0, 1, 2, 5} {
							keys := make([]offload.Key, n)
							src, dst := make([]int64, n), make([]int64, n)
							for i := range n {
								keys[i] = k(100 + next)
								src[i], dst[i] = int64(i), int64(10+i)
								a.fill(src[i], uint64(next))
								next++
							}
							if res := run(t, tier, false, a, req("r"), keys, src); !res.Success {
								t.Fatalf("store of %d: %+v", n, res)
							}
							if res := run(t, tier, true, a, req("r"), keys, dst); !res.Success {
								t.Fatalf("load of %d: %+v", n, res)
							}
							for i := range n {
								if !bytes.Equal(a.slot(src[i]), a.slot(dst[i])) {
									t.Fatalf("batch %d block %d differs after round trip", n, i)
								}
							}
						}
						want := int64(size)
						if format == "kvtier" {
							want += trailerLen
						}
						if tail := want % align; direct == "padded" && tier.Direct() && tail != 0 && refuse.Injected() == 0 {
							t.Fatal("the padded fallback never ran")
						}
						for i := range next {
							fi, err := os.Stat(tier.Path(k(100 + i)))
							if err != nil || fi.Size() != want {
								t.Fatalf("block %d: file size %v (%v), want %d", i, fi.Size(), err, want)
							}
						}
					})
				}
			}
		}
	}
}

// Case 71: out-of-range slots fail store and load jobs.
func TestCase71SlotOutOfRange(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 2, true)
	res := run(t, tier, false, a, req("r"), []offload.Key{k(1), k(2)}, []int64{0, 7})
	if res.Success || !errors.Is(res.Err, offload.ErrSlotOutOfRange) {
		t.Fatalf("store to slot 7 of 2: %+v", res)
	}
	if _, err := os.Stat(tier.Path(k(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a job with a bad slot wrote blocks")
	}
	run(t, tier, false, a, req("r"), []offload.Key{k(1)}, []int64{0})
	res = run(t, tier, true, a, req("r"), []offload.Key{k(1)}, []int64{-1})
	if res.Success || !errors.Is(res.Err, offload.ErrSlotOutOfRange) {
		t.Fatalf("load to slot -1: %+v", res)
	}
	if _, err := os.Stat(tier.Path(k(1))); err != nil {
		t.Fatal("a load with a bad slot deleted the file")
	}
	if res := run(t, tier, true, a, req("r"), []offload.Key{k(1)}, nil); res.Success || !errors.Is(res.Err, ErrBadJob) {
		t.Fatalf("keys without slots: %+v", res)
	}
}

// corruptions used by cases 72–74.
var corruptions = map[string]func(t *testing.T, path string){
	"short": func(t *testing.T, path string) {
		if err := os.Truncate(path, 100); err != nil {
			t.Fatal(err)
		}
	},
	"flipped byte": func(t *testing.T, path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/3] ^= 0x40
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	},
	"bad trailer": func(t *testing.T, path string) {
		b, _ := os.ReadFile(path)
		copy(b[len(b)-trailerLen:], "XXXX")
		os.WriteFile(path, b, 0o644)
	},
}

// Case 72: a corrupt file fails the load, is deleted and counted; the
// request then misses without re-probing; a fresh request probes and misses.
func TestCase72Corrupt(t *testing.T) {
	for name, corrupt := range corruptions {
		t.Run(name, func(t *testing.T) {
			tier := newTier(t, t.TempDir(), nil)
			a := newArena(bs, 4, true)
			run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
			r := req("r")
			if got := lookupAll(t, tier, r, k(1)); got[0] != offload.Hit {
				t.Fatalf("lookup before corruption = %v", got[0])
			}
			corrupt(t, tier.Path(k(1)))
			res := run(t, tier, true, a, r, []offload.Key{k(1)}, []int64{1})
			if res.Success || !errors.Is(res.Err, ErrCorrupt) || res.SuccessfulKeys != nil {
				t.Fatalf("load of a corrupt file: %+v", res)
			}
			if _, err := os.Stat(tier.Path(k(1))); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("corrupt file not deleted")
			}
			if s := tier.Stats(); s.CorruptBlocks != 1 || s.Files != 0 {
				t.Fatalf("stats after corruption: %+v", s)
			}
			if got := tier.Lookup(k(1), r); got != offload.Miss {
				t.Fatalf("same request after failed load = %v, want MISS (no re-probe)", got)
			}
			if tier.lookups.Pending() {
				t.Fatal("the failing request queued a re-probe")
			}
			fresh := req("fresh")
			if got := tier.Lookup(k(1), fresh); got != offload.Retry {
				t.Fatalf("fresh request first lookup = %v, want RETRY (re-probe)", got)
			}
			if got := lookupAll(t, tier, fresh, k(1)); got[0] != offload.Miss {
				t.Fatalf("fresh request = %v, want MISS", got[0])
			}
		})
	}
}

// Cases 73 and 74, as kvtier has them since issue 11: a bad block fails
// alone, the others of the batch are loaded and reported in
// SuccessfulKeys; only the failed key misses for the request (and, as it
// was deleted, for a fresh one).
func TestCase73And74PartialLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bad     int
		ok      []offload.Key
		sameReq []offload.LookupResult
		fresh   []offload.LookupResult
	}{
		{"last bad", 2, []offload.Key{k(1), k(2)},
			results(offload.Hit, offload.Hit, offload.Miss), results(offload.Hit, offload.Hit, offload.Miss)},
		{"first bad", 0, []offload.Key{k(2), k(3)},
			results(offload.Miss, offload.Hit, offload.Hit), results(offload.Miss, offload.Hit, offload.Hit)},
		{"middle bad", 1, []offload.Key{k(1), k(3)},
			results(offload.Hit, offload.Miss, offload.Hit), results(offload.Hit, offload.Miss, offload.Hit)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tier := newTier(t, t.TempDir(), nil)
			a := newArena(bs, 8, true)
			keys := []offload.Key{k(1), k(2), k(3)}
			for i := range 3 {
				a.fill(int64(i), uint64(i+1))
			}
			run(t, tier, false, a, req("w"), keys, []int64{0, 1, 2})
			r := req("r")
			if got := lookupAll(t, tier, r, keys...); !slices.Equal(got, results(offload.Hit, offload.Hit, offload.Hit)) {
				t.Fatalf("lookups before = %v", got)
			}
			corruptions["short"](t, tier.Path(keys[tc.bad]))
			res := run(t, tier, true, a, r, keys, []int64{4, 5, 6})
			if res.Success || !slices.Equal(res.SuccessfulKeys, tc.ok) {
				t.Fatalf("result %+v, want failure with SuccessfulKeys %v", res, tc.ok)
			}
			for i := range keys {
				if i != tc.bad && !bytes.Equal(a.slot(int64(i)), a.slot(int64(4+i))) {
					t.Fatalf("good block %d not loaded", i)
				}
			}
			got := make([]offload.LookupResult, len(keys))
			for i, key := range keys {
				got[i] = tier.Lookup(key, r)
			}
			if !slices.Equal(got, tc.sameReq) {
				t.Fatalf("same request lookups = %v, want %v", got, tc.sameReq)
			}
			if got := lookupAll(t, tier, req("fresh"), keys...); !slices.Equal(got, tc.fresh) {
				t.Fatalf("fresh request lookups = %v, want %v", got, tc.fresh)
			}
		})
	}
}

// Case 75: a transient open error fails the job and leaves the file.
func TestCase75TransientOpenError(t *testing.T) {
	for _, errno := range []error{syscall.EMFILE, syscall.ELOOP, syscall.EIO} {
		t.Run(errno.Error(), func(t *testing.T) {
			in := vfstest.NewInjector(vfs.OS(), nil)
			tier := newTier(t, t.TempDir(), func(c *Config) { c.FS = in })
			a := newArena(bs, 4, true)
			run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
			in.SetRule(vfstest.On(vfstest.OpOpen, ".bin", vfstest.Fault{Err: errno}))
			res := run(t, tier, true, a, req("r"), []offload.Key{k(1)}, []int64{1})
			if res.Success || !errors.Is(res.Err, errno) {
				t.Fatalf("load: %+v", res)
			}
			if _, err := os.Stat(tier.Path(k(1))); err != nil {
				t.Fatalf("file removed after a transient error: %v", err)
			}
			if s := tier.Stats(); s.TransientErrors != 1 || s.CorruptBlocks != 0 || s.Files != 1 {
				t.Fatalf("stats: %+v", s)
			}
			in.SetRule(nil)
			if res := run(t, tier, true, a, req("r2"), []offload.Key{k(1)}, []int64{1}); !res.Success {
				t.Fatalf("load after the error cleared: %+v", res)
			}
		})
	}
	// EIO while reading is not proof of corruption either.
	in := vfstest.NewInjector(vfs.OS(), nil)
	tier := newTier(t, t.TempDir(), func(c *Config) { c.FS = in })
	a := newArena(bs, 4, true)
	run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
	in.SetRule(vfstest.On(vfstest.OpRead, ".bin", vfstest.Fault{Err: syscall.EIO}))
	if res := run(t, tier, true, a, req("r"), []offload.Key{k(1)}, []int64{1}); res.Success || !errors.Is(res.Err, syscall.EIO) {
		t.Fatalf("load with EIO: %+v", res)
	}
	if _, err := os.Stat(tier.Path(k(1))); err != nil {
		t.Fatal("file removed after EIO")
	}
	// A short read of a file whose size is right is corruption.
	in.SetRule(vfstest.On(vfstest.OpRead, ".bin", vfstest.Fault{Short: true}))
	if res := run(t, tier, true, a, req("r"), []offload.Key{k(1)}, []int64{1}); res.Success || !errors.Is(res.Err, ErrCorrupt) {
		t.Fatalf("load with a short read: %+v", res)
	}
}

// Case 76: events.
func TestCase76Events(t *testing.T) {
	t.Run("stored event per successful store job", func(t *testing.T) {
		tier := newTier(t, t.TempDir(), func(c *Config) { c.Events = true })
		a := newArena(bs, 4, true)
		keys := []offload.Key{k(2), k(1)}
		run(t, tier, false, a, req("r"), keys, []int64{0, 1})
		ev := tier.TakeEvents()
		want := []offload.Event{{Keys: keys, Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Tier: "fs0"}}
		if !eventsEqual(ev, want) {
			t.Fatalf("events %+v, want %+v", ev, want)
		}
		if ev := tier.TakeEvents(); ev != nil {
			t.Fatalf("TakeEvents did not drain: %+v", ev)
		}
		run(t, tier, true, a, req("r"), keys, []int64{2, 3})
		if ev := tier.TakeEvents(); ev != nil {
			t.Fatalf("load emitted events: %+v", ev)
		}
	})
	t.Run("locality on events", func(t *testing.T) {
		for loc, want := range map[string]offload.Locality{"": offload.LocalityLocal, "REMOTE": offload.LocalityRemote} {
			tier := newTier(t, t.TempDir(), func(c *Config) { c.Events, c.Locality = true, loc })
			run(t, tier, false, newArena(bs, 1, true), req("r"), []offload.Key{k(1)}, []int64{0})
			if ev := tier.TakeEvents(); len(ev) != 1 || ev[0].Locality != want {
				t.Fatalf("locality %q: events %+v", loc, ev)
			}
		}
	})
	t.Run("failed and partially failed jobs emit nothing", func(t *testing.T) {
		in := vfstest.NewInjector(vfs.OS(), nil)
		tier := newTier(t, t.TempDir(), func(c *Config) { c.Events, c.FS = true, in })
		a := newArena(bs, 4, true)
		in.SetRule(vfstest.On(vfstest.OpWrite, k(3).HexHash(), vfstest.Fault{Err: syscall.ENOSPC}))
		tier.SubmitStore(&offload.Job{ID: 1, Keys: []offload.Key{k(1)}, Slots: []int64{0}, Arena: a})
		tier.SubmitStore(&offload.Job{ID: 2, Keys: []offload.Key{k(2), k(3)}, Slots: []int64{1, 2}, Arena: a})
		res := collect(t, tier, 2)
		for _, r := range res {
			if (r.JobID == 1) != r.Success {
				t.Fatalf("result %+v", r)
			}
		}
		ev := tier.TakeEvents()
		if len(ev) != 1 || !slices.Equal(ev[0].Keys, []offload.Key{k(1)}) {
			t.Fatalf("events %+v, want one for job 1", ev)
		}
	})
	t.Run("off by default", func(t *testing.T) {
		tier := newTier(t, t.TempDir(), nil)
		run(t, tier, false, newArena(bs, 1, true), req("r"), []offload.Key{k(1)}, []int64{0})
		if ev := tier.TakeEvents(); ev != nil {
			t.Fatalf("events without opt-in: %+v", ev)
		}
	})
	t.Run("opt-in with events off globally", func(t *testing.T) {
		tier := newTier(t, t.TempDir(), func(c *Config) { c.Events, c.GlobalEventsOff = true, true })
		run(t, tier, false, newArena(bs, 1, true), req("r"), []offload.Key{k(1)}, []int64{0})
		if ev := tier.TakeEvents(); ev != nil {
			t.Fatalf("events with the global flag off: %+v", ev)
		}
	})
}

func eventsEqual(a, b []offload.Event) bool {
	return slices.EqualFunc(a, b, func(x, y offload.Event) bool {
		return slices.Equal(x.Keys, y.Keys) && x.Medium == y.Medium && x.Locality == y.Locality && x.Removed == y.Removed && x.Tier == y.Tier
	})
}

func TestEmptyJobsCompleteAtOnce(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	for _, promo := range []bool{false, true} {
		if res := run(t, tier, promo, nil, req("r"), nil, nil); !res.Success {
			t.Fatalf("empty job (promotion=%v): %+v", promo, res)
		}
	}
}

func TestForeignFormatRefusedNotDeleted(t *testing.T) {
	dir := t.TempDir()
	raw := newTier(t, dir, func(c *Config) { c.Format = "vllm" })
	a := newArena(bs, 2, true)
	run(t, raw, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
	raw.Close(context.Background())
	tier := newTier(t, dir, nil)
	res := run(t, tier, true, a, req("r"), []offload.Key{k(1)}, []int64{1})
	if res.Success || !errors.Is(res.Err, ErrForeignFormat) {
		t.Fatalf("kvtier load of a raw file: %+v", res)
	}
	if _, err := os.Stat(tier.Path(k(1))); err != nil {
		t.Fatal("a raw vLLM file was deleted")
	}
}

// A raw vLLM file that a kvtier-format tier can never serve is a miss for
// lookups when the block size is known, so that a directory shared with a
// vLLM that writes raw files does not cost every request a failed load.
func TestForeignFormatIsAMiss(t *testing.T) {
	dir := t.TempDir()
	raw := newTier(t, dir, func(c *Config) { c.Format = "vllm" })
	a := newArena(bs, 2, true)
	run(t, raw, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
	raw.Close(context.Background())
	for _, restart := range []bool{false, true} {
		tier := newTier(t, dir, func(c *Config) { c.Namespace.BlockBytes = bs })
		if !restart { // found by the existence check, not the start-up scan
			tier.mu.Lock()
			tier.idx = newIndex()
			tier.mu.Unlock()
		}
		if got := lookupAll(t, tier, req("r"), k(1)); !slices.Equal(got, results(offload.Miss)) {
			t.Fatalf("lookup of a raw file (indexed at start %v) = %v, want MISS", restart, got)
		}
		tier.Close(context.Background())
	}
	if _, err := os.Stat(raw.Path(k(1))); err != nil {
		t.Fatal("a raw vLLM file was deleted")
	}
}

func TestChecksumBindsKey(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 2, true)
	run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
	// Copy k1's file under k2's name: the trailer is valid but for k1.
	b, _ := os.ReadFile(tier.Path(k(1)))
	os.MkdirAll(filepath.Dir(tier.Path(k(2))), 0o755)
	os.WriteFile(tier.Path(k(2)), b, 0o644)
	res := run(t, tier, true, a, req("r"), []offload.Key{k(2)}, []int64{1})
	if res.Success || !errors.Is(res.Err, ErrCorrupt) {
		t.Fatalf("load of a misplaced file: %+v", res)
	}
}

func TestStoreSkipsExisting(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 2, true)
	a.fill(0, 1)
	run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
	before, _ := os.ReadFile(tier.Path(k(1)))
	a.fill(0, 2)
	if res := run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0}); !res.Success || res.Bytes != 0 {
		t.Fatalf("second store: %+v", res)
	}
	after, _ := os.ReadFile(tier.Path(k(1)))
	if !bytes.Equal(before, after) {
		t.Fatal("existing file rewritten")
	}
	if s := tier.Stats(); s.BlocksSkipped != 1 || s.BlocksStored != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestBlockBytesMismatch(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.Namespace.BlockBytes = 4096 })
	res := run(t, tier, false, newArena(bs, 1, true), req("r"), []offload.Key{k(1)}, []int64{0})
	if res.Success || !errors.Is(res.Err, ErrBadJob) {
		t.Fatalf("store with the wrong slot size: %+v", res)
	}
}

// A store job reads a block's slot only while it writes that block
// (offload.BlockClaimer): the block being written cannot be taken back,
// a later one can, and the job then stores and announces the others only.
func TestStoreSkipsBlocksTakenBack(t *testing.T) {
	keys := []offload.Key{k(1), k(2), k(3)}
	claims := offload.NewClaims(len(keys))
	var writing, later bool
	var once sync.Once
	in := vfstest.NewInjector(vfs.OS(), func(op vfstest.Op, path string) *vfstest.Fault {
		if op == vfstest.OpWrite && strings.Contains(path, keys[1].HexHash()) {
			once.Do(func() { writing, later = claims.Revoke(1), claims.Revoke(2) })
		}
		return nil
	})
	tier := newTier(t, t.TempDir(), func(c *Config) { c.Events, c.FS, c.WriteThreads = true, in, 1 })
	if !tier.ClaimsBlocks() {
		t.Fatal("the fs tier does not claim blocks")
	}
	a := newArena(bs, 3, true)
	for i := range keys {
		a.fill(int64(i), uint64(i+1))
	}
	tier.SubmitStore(&offload.Job{ID: 1, Keys: keys, Slots: []int64{0, 1, 2}, Arena: a, Claims: claims})
	if res := collect(t, tier, 1); !res[0].Success {
		t.Fatalf("store: %+v", res[0])
	}
	if writing || !later {
		t.Fatalf("revoke during the write of block 1: %v (want false), of block 2: %v (want true)", writing, later)
	}
	if got := lookupAll(t, tier, req("r"), keys...); !slices.Equal(got, results(offload.Hit, offload.Hit, offload.Miss)) {
		t.Fatalf("lookups %v, want HIT HIT MISS", got)
	}
	ev := tier.TakeEvents()
	if len(ev) != 1 || !slices.Equal(ev[0].Keys, keys[:2]) {
		t.Fatalf("events %+v, want one announcing the two blocks written", ev)
	}
}
