package tiering

import (
	"fmt"
	"math"

	"github.com/kvtier/kvtier/offload"
)

// DropReason says why a cascade job was not carried out: the blocks stay
// in the primary (or the engine's arena) only.
type DropReason uint8

// Drop reasons, in the order of the checks.
const (
	// DropPressure: the tier is under back-pressure (AdmissionConfig).
	DropPressure DropReason = iota
	// DropBudget: the slots cascades in flight may pin together are spent.
	DropBudget
	// DropTierBudget: the tier's own share of the pin budget is spent.
	DropTierBudget
	// DropQueueFull: the tier's queue was full, or it refused the job
	// because it had its maximum of jobs in flight.
	DropQueueFull
	// DropTierDown: the tier refused the job because its server is down.
	DropTierDown
	// DropCancelled: the job was still queued when an engine store needed
	// its source blocks evicted, and was withdrawn.
	DropCancelled
	// DropTenantBudget: the share of the pin budget of the tenant whose
	// blocks these are is spent (StackConfig.Owners).
	DropTenantBudget
	// DropEvicted: the cascade was deferred for the budget
	// (BudgetConfig.MaxDeferred) and its blocks left the primary before
	// the budget took it; the primary alone would have lost them too.
	DropEvicted
	// NumDropReasons is the number of drop reasons.
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"pressure", "budget", "tier_budget", "queue_full", "tier_down", "cancelled", "tenant_budget", "evicted"}

// String returns the reason's metric label.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return fmt.Sprintf("DropReason(%d)", uint8(r))
}

// Defaults of BudgetConfig.
const (
	// DefaultBudgetFraction is the share of the primary's slots that
	// cascades in flight may pin together. BENCHMARKS.md ("Cascade pin
	// budget") measures the trace replay over fractions from 0.05 to 1:
	// at 0.25 the hit rate is within 0.001 of the best fraction at every
	// tier speed measured, and an engine store always finds three
	// quarters of the primary free of cascade pins.
	DefaultBudgetFraction = 0.25
	// DefaultTierFraction is the share of the budget one tier's cascades
	// may pin when the stack has more than one tier, so that a slow tier
	// cannot take the whole budget from a fast one. With one tier it may
	// use the whole budget.
	DefaultTierFraction = 0.5
)

// BudgetConfig bounds the primary slots that cascades in flight pin
// (docs/design.md §7: a secondary tier never makes the cache worse than the
// primary alone). A cascade that does not fit waits, unpinned, in a
// bounded queue of deferred cascades and goes when the budget frees and
// its blocks are still in the primary; when the queue is full it is
// dropped and counted with DropBudget, DropTierBudget or
// DropTenantBudget. Engine loads and promotions are never refused because
// of cascades. The zero value means the defaults.
//
// A cascade of one store batch counts its blocks once against the
// budget, however many tiers it goes to, and once against each of those
// tiers. When no cascade is in flight one is always admitted, even if its
// batch alone exceeds the budget (a primary smaller than one batch would
// otherwise never cascade); nothing else is admitted until it ends.
type BudgetConfig struct {
	// Disabled lets cascades pin without bound (vLLM's behaviour, which
	// the spec's acceptance cases assume).
	Disabled bool
	// Fraction is the share of the primary's slots all cascades may pin,
	// in (0, 1]; 0 means DefaultBudgetFraction.
	Fraction float64
	// TierFraction is the share of the budget each tier may pin, in
	// (0, 1]; 0 means DefaultTierFraction with several tiers and 1 with
	// one.
	TierFraction float64
	// MaxDeferred bounds the blocks of the cascades waiting for the
	// budget: 0 means as many as the primary has slots (a deferred block
	// is a block in the primary, so more could never be cascaded), a
	// negative value turns deferral off (a cascade over the budget is
	// dropped at once).
	MaxDeferred int
}

func (c BudgetConfig) validate() error {
	for _, v := range []struct {
		name string
		x    float64
	}{{"fraction", c.Fraction}, {"tier_fraction", c.TierFraction}} {
		if math.IsNaN(v.x) || v.x < 0 || v.x > 1 {
			return fmt.Errorf("tiering: cascade budget %s %v: want 0 (default) or a value in (0, 1]", v.name, v.x)
		}
	}
	return nil
}

// limits turns c into slot counts for an arena of slots slots and ntiers
// tiers; 0 means unbounded.
func (c BudgetConfig) limits(slots, ntiers int) (total, perTier int) {
	if c.Disabled || slots <= 0 {
		return 0, 0
	}
	f := c.Fraction
	if f == 0 {
		f = DefaultBudgetFraction
	}
	tf := c.TierFraction
	if tf == 0 {
		tf = 1
		if ntiers > 1 {
			tf = DefaultTierFraction
		}
	}
	total = max(1, int(math.Ceil(f*float64(slots))))
	perTier = max(1, int(math.Ceil(tf*float64(total))))
	return total, perTier
}

// Owners divides the pin budget between the owners of the blocks (the
// primary's tenants, cpu.Share): the cascades of one owner's blocks may
// pin at most its share of the budget, so that a tenant flooding stores
// cannot take every cascade from the others. As with the whole budget,
// an owner with nothing in flight always gets one cascade through.
type Owners struct {
	// Of returns the owner of a key, in [0, len(Shares)).
	Of func(offload.Key) int
	// Shares are each owner's share of the budget, in [0, 1].
	Shares []float64
}

// limits returns each owner's share of a budget of total slots (nil when
// there are no owners or no budget).
func (o Owners) limits(total int) []int {
	if o.Of == nil || total == 0 {
		return nil
	}
	out := make([]int, len(o.Shares))
	for i, f := range o.Shares {
		out[i] = max(1, int(math.Ceil(f*float64(total))))
	}
	return out
}
