package fs

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/offload"
)

// A seeded corruption run: Check finds exactly the files damaged, the
// strays planted and the foreign file, nothing else; Repair removes the
// first two kinds and leaves a clean tier that serves every intact block.
func TestCheckFindsEveryCorruptFileAndNothingElse(t *testing.T) {
	const bs, n = 4096, 300
	dir := t.TempDir()
	mod := func(c *Config) { c.Namespace.BlockBytes = bs }
	tier := newTier(t, dir, mod)
	a := newArena(bs, n, true)
	keys := make([]offload.Key, n)
	slots := make([]int64, n)
	for i := range keys {
		keys[i], slots[i] = hashKey(i), int64(i)
		a.fill(int64(i), uint64(i))
	}
	for i := 0; i < n; i += 50 {
		if res := run(t, tier, false, a, req("r"), keys[i:i+50], slots[i:i+50]); !res.Success {
			t.Fatal(res.Err)
		}
	}
	// While the tier is open, Check refuses: a daemon holds it.
	if _, err := Check(context.Background(), testConfig(dir, mod), CheckOptions{}); !errors.Is(err, dirlock.ErrLocked) {
		t.Fatalf("Check beside an open tier: %v, want ErrLocked", err)
	}
	if err := tier.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(42, 7))
	damages := []func(path string) error{
		func(p string) error { return flipByte(p, rng.Int64N(bs)) },    // payload
		func(p string) error { return flipByte(p, bs+rng.Int64N(24)) }, // trailer
		func(p string) error { return os.Truncate(p, rng.Int64N(bs)) }, // short
		func(p string) error { return os.Truncate(p, bs+24+1) },        // long
		func(p string) error { return os.WriteFile(p, make([]byte, bs+24), 0o600) },
	}
	corrupted := map[string]bool{}
	for _, i := range rng.Perm(n)[:37] {
		p := tier.Path(keys[i])
		if err := damages[rng.IntN(len(damages))](p); err != nil {
			t.Fatal(err)
		}
		corrupted[p] = true
	}
	rankDir := filepath.Dir(filepath.Dir(filepath.Dir(tier.Path(keys[0]))))
	strays := map[string]bool{
		tier.Path(keys[0]) + "_x1.tmp":            true,
		filepath.Join(rankDir, "README"):          true,
		filepath.Join(rankDir, "abc", "junk.bin"): true,
	}
	for p := range strays {
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	foreignKey := hashKey(n + 1)
	foreign := tier.Path(foreignKey)
	os.MkdirAll(filepath.Dir(foreign), 0o700)
	if err := os.WriteFile(foreign, make([]byte, bs), 0o600); err != nil { // a raw vLLM block
		t.Fatal(err)
	}

	var progress []int
	rep, err := Check(context.Background(), testConfig(dir, mod), CheckOptions{Progress: func(done, total int) { progress = append(progress, done, total) }})
	if err != nil {
		t.Fatal(err)
	}
	got := map[FindingKind]map[string]bool{Corrupt: {}, Stray: {}, Foreign: {}}
	for _, f := range rep.Findings {
		got[f.Kind][f.Path] = true
		if f.Removed {
			t.Errorf("%s removed without Repair", f.Path)
		}
	}
	if !mapsEqual(got[Corrupt], corrupted) {
		t.Errorf("corrupt: found %d, damaged %d; found %v", len(got[Corrupt]), len(corrupted), got[Corrupt])
	}
	if !mapsEqual(got[Stray], strays) {
		t.Errorf("stray: found %v, planted %v", got[Stray], strays)
	}
	if !mapsEqual(got[Foreign], map[string]bool{foreign: true}) {
		t.Errorf("foreign: found %v, want %s", got[Foreign], foreign)
	}
	if files := n + len(strays) + 1; rep.Files != files || rep.Blocks != n-len(corrupted) {
		t.Errorf("files %d, blocks %d; want %d files, %d good blocks", rep.Files, rep.Blocks, files, n-len(corrupted))
	}
	if len(progress) < 2 || progress[len(progress)-2] != rep.Files || progress[len(progress)-1] != rep.Files {
		t.Errorf("progress ended at %v, want %d/%d", progress[max(0, len(progress)-2):], rep.Files, rep.Files)
	}

	rep, err = Check(context.Background(), testConfig(dir, mod), CheckOptions{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if f.Removed == (f.Kind == Foreign) {
			t.Errorf("repair: %s %s removed=%v", f.Kind, f.Path, f.Removed)
		}
	}
	rep, err = Check(context.Background(), testConfig(dir, mod), CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 1 || rep.Blocks != n-len(corrupted) {
		t.Fatalf("after repair: %d blocks, findings %+v", rep.Blocks, rep.Findings)
	}
	// The tier serves every intact block and misses the removed ones.
	after := newTier(t, dir, mod)
	b := newArena(bs, n, true)
	res := run(t, after, true, b, req("r2"), keys, slots)
	if len(res.SuccessfulKeys) != n-len(corrupted) {
		t.Fatalf("loaded %d blocks, want the %d intact ones (%v)", len(res.SuccessfulKeys), n-len(corrupted), res.Err)
	}
	for _, k := range res.SuccessfulKeys {
		i := slices.Index(keys, k)
		if !slices.Equal(b.slot(int64(i)), a.slot(int64(i))) {
			t.Fatalf("block %d loaded with other bytes", i)
		}
	}
}

func flipByte(p string, off int64) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return err
	}
	b[0] ^= 0x40
	_, err = f.WriteAt(b, off)
	return err
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
