package quota

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

func units(v int64) string { return fmt.Sprint(v) }

func TestVictim(t *testing.T) {
	a, _ := keyspace.New("a")
	b, _ := keyspace.New("b")
	tb, err := New([]Share{{Space: a.ID(), Quota: 40}, {Space: b.ID(), Quota: 40, Weight: 3}}, 100, units)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Owners() != 3 || tb.Quota(0) != 20 || tb.Space(1) != a.ID() {
		t.Fatalf("owners %d, pool quota %d", tb.Owners(), tb.Quota(0))
	}
	none := []bool{false, false, false}
	for _, tc := range []struct {
		held      []int64
		exhausted []bool
		storer    int
		want      int
	}{
		{[]int64{20, 40, 40}, none, 1, 1},                       // nobody above quota: the storer
		{[]int64{20, 40, 40}, none, -1, -1},                     // ... and no storer: nothing
		{[]int64{10, 50, 40}, none, 2, 1},                       // a above its quota pays for b's store
		{[]int64{0, 50, 50}, none, 1, 1},                        // a 10 over (weight 1) beats b 10 over (weight 3)
		{[]int64{0, 45, 55}, none, 1, 1},                        // 5 vs 15/3 = 5: the first
		{[]int64{0, 44, 56}, none, 1, 2},                        // 4 vs 16/3
		{[]int64{10, 50, 40}, []bool{false, true, false}, 2, 2}, // a has nothing to give: the storer
		{[]int64{10, 50, 40}, []bool{false, true, true}, 2, -1}, // nor the storer
		{[]int64{30, 35, 35}, none, 1, 0},                       // the pool above its quota
	} {
		if got := tb.Victim(tc.held, tc.exhausted, tc.storer); got != tc.want {
			t.Errorf("held %v exhausted %v storer %d: victim owner %d, want %d", tc.held, tc.exhausted, tc.storer, got, tc.want)
		}
	}
	if o := tb.OwnerOf(b.Key([]byte("k\x00\x00\x00\x00"))); o != 2 {
		t.Errorf("b's key owned by %d", o)
	}
	stray, _ := keyspace.New("stray")
	if o := tb.OwnerOf(stray.Key([]byte("k\x00\x00\x00\x00"))); o != 0 {
		t.Errorf("a key of no share owned by %d, want the pool", o)
	}
	if o := tb.OwnerOf(offload.Key("k\x00\x00\x00\x00")); o != 0 {
		t.Errorf("an untagged key owned by %d", o)
	}
}

func TestNewErrors(t *testing.T) {
	a, _ := keyspace.New("a")
	if _, err := New([]Share{{Space: a.ID(), Quota: 101}}, 100, units); !errors.Is(err, ErrOverCommitted) {
		t.Errorf("over-committed: %v", err)
	}
	for _, bad := range [][]Share{
		{{Space: 0, Quota: 1}},
		{{Space: a.ID(), Quota: -1}},
		{{Space: a.ID(), Weight: -1}},
		{{Space: a.ID()}, {Space: a.ID()}},
	} {
		if _, err := New(bad, 100, units); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
