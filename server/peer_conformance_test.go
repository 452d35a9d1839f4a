package server_test

import (
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/tiers/peer"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// The peer tier runs the conformance cases every tier runs
// (tiers/remote/remotetest) against a real peer daemon: it pushes the
// manager's cascades into the peer's primary and promotes them back over
// the block stream. It lives here, not in tiers/peer, because its peer is
// this package's daemon. A peer tier deletes nothing on request (the
// peer's blocks are its own daemon's), so RunManagerDelete is not its.
func TestPeerConformanceThroughManager(t *testing.T) {
	const size = 64 << 10 // remotetest's slot size
	p := startEnvSlot(t, envOptions{slots: 64, tiers: noTiers, stream: true}, size)
	tier, err := peer.New(peer.Config{Name: "fleet", Push: true, EventIndex: new(bool),
		Peers: []peer.PeerConfig{{Name: "a", Addr: p.tcp}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rt.RunManager(t, rt.ManagerCase{Tier: tier, SlotSize: size, Dynamic: true, ExcludeLoad: `{"kv_load_tiers": [{"medium": "storage"}]}`})
}
