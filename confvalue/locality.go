package confvalue

import (
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/offload"
)

// ParseLocality reads a tier's configured locality: local or remote, in any
// case, and "" for none (the caller's default: unspecified for most tiers,
// local for an fs tier, derived from the address for a peer). Every tier's
// config and the daemon's own read it here, so they cannot disagree.
// "global" is refused: it is a request-side synonym of remote in
// kv_load_tiers / kv_store_tiers, and a config names a tier's placement
// exactly (docs/semantics.md §8.5).
func ParseLocality(s string) (offload.Locality, error) {
	switch strings.ToLower(s) {
	case "":
		return offload.LocalityUnspecified, nil
	case "local":
		return offload.LocalityLocal, nil
	case "remote":
		return offload.LocalityRemote, nil
	case "global":
		return offload.LocalityUnspecified, fmt.Errorf("invalid value %q (want local or remote: global is a request filter's synonym of remote, a config names the placement)", s)
	}
	return offload.LocalityUnspecified, fmt.Errorf("invalid value %q (want local or remote)", s)
}
