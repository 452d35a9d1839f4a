package s3

import (
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// Layout names block objects after the FS tier's files (docs/semantics.md §5.1), so
// that a bucket prefix holds the same tree an FS root would:
//
//	<prefix>/<base>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin
//
// where hex is the lowercase hex of the block hash (group suffix
// stripped).
type Layout struct {
	// Base is the namespace directory "<model name, / replaced by _>_<digest>"
	// of the FS layout. Empty means "kvtier".
	Base string
	// Rank is the worker rank of the `_r<rank>` suffix.
	Rank int
}

const defaultLayoutBase = "kvtier"

// LayoutOf returns the layout of an FS tier (format kvtier) with
// namespace ns: base "<model name, / replaced by _>_<digest>", followed
// by "_b<block bytes>" when ns names its block size, and ns's rank.
func LayoutOf(ns filemapper.Namespace) (Layout, error) {
	if ns.ModelName == "" {
		return Layout{}, fmt.Errorf("model_name is required")
	}
	if ns.Rank < 0 {
		return Layout{}, fmt.Errorf("rank must be >= 0, got %d", ns.Rank)
	}
	// As in the fs tier's kvtier format, the base names the block size:
	// objects of two block sizes never share names, so neither is ever
	// taken for a corrupt copy of the other and deleted.
	base, err := ns.Base(true)
	if err != nil {
		return Layout{}, err
	}
	return Layout{Base: base, Rank: ns.Rank}, nil
}

// layoutOf resolves the layout c uses: Layout when set, else the one of
// c.Namespace, else the default base.
func (c Config) layoutOf() (Layout, error) {
	if c.Layout.Base != "" || c.Namespace.ModelName == "" {
		return c.Layout, nil
	}
	return LayoutOf(c.Namespace)
}

func (l Layout) validate() error {
	if l.Rank < 0 {
		return fmt.Errorf("rank must be >= 0, got %d", l.Rank)
	}
	if strings.ContainsAny(l.Base, "/\\") || l.Base == "." || l.Base == ".." {
		return fmt.Errorf("base %q must be one path element", l.Base)
	}
	return nil
}

// Path returns the object path of k below the prefix. Keys are
// hex-encoded, so no key can escape the layout.
func (l Layout) Path(k offload.Key) string {
	return l.dir() + "/" + filemapper.RelPath(k)
}

// dir is the rank directory every block path starts with.
func (l Layout) dir() string {
	base := l.Base
	if base == "" {
		base = defaultLayoutBase
	}
	return filemapper.RankDir(base, l.Rank)
}

// objectKey joins the configured prefix and the layout path.
func objectKey(prefix string, l Layout, k offload.Key) string {
	if prefix == "" {
		return l.Path(k)
	}
	return prefix + "/" + l.Path(k)
}
