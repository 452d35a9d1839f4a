package fs

import (
	"path/filepath"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// Dirs returns where a tier of format with namespace ns under root keeps
// its files: base holds config.json, blocks holds the block files
// (base_r<rank>). In format vllm these are the directories vLLM's own fs
// tier uses for the same fields.
func Dirs(ns filemapper.Namespace, root string, format Format) (base, blocks string, err error) {
	l, err := newLayout(root, ns.WithDefaults(), format)
	return l.base, l.rankDir, err
}

// layout maps keys to paths under one namespace.
type layout struct {
	base    string // <root>/<model>_<digest>: holds config.json
	rankDir string // <base>_r<rank>: holds the blocks
}

// In kvtier's own format the base also names the block size,
// <model>_<digest>_b<bytes>, so that tiers of two block sizes never share
// files (vLLM's format must keep vLLM's directory; there a file of another
// size is refused as foreign, not deleted).
func newLayout(root string, ns filemapper.Namespace, format Format) (layout, error) {
	name, err := ns.Base(format == FormatKVTier)
	if err != nil {
		return layout{}, err
	}
	base := filepath.Join(root, name)
	return layout{base: base, rankDir: filemapper.RankDir(base, ns.Rank)}, nil
}

// path returns the block file of k: <base>_r<rank>/ and its
// filemapper.RelPath.
func (l layout) path(k offload.Key) string { return l.rankDir + "/" + filemapper.RelPath(k) }
