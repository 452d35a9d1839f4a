package server

import (
	"reflect"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// TestSplitEvents: an event whose keys go to several publishers is split
// into runs, in order, each key once, the event's other fields kept.
func TestSplitEvents(t *testing.T) {
	k := func(s string) offload.Key { return offload.Key(s) }
	evs := []offload.Event{
		{Keys: []offload.Key{k("a1"), k("b1"), k("a2"), k("a3"), k("x1")}, Medium: offload.MediumCPU, Tier: "primary"},
		{Keys: []offload.Key{k("a4")}, Medium: offload.MediumStorage, Removed: true, Tier: "disk"},
	}
	own := func(k offload.Key) string {
		if k[0] == 'a' {
			return "acme"
		}
		return "shared"
	}
	order, parts := splitEvents(evs, own)
	if !reflect.DeepEqual(order, []string{"acme", "shared"}) {
		t.Fatalf("order %v", order)
	}
	want := map[string][]offload.Event{
		"acme": {
			{Keys: []offload.Key{k("a1")}, Medium: offload.MediumCPU, Tier: "primary"},
			{Keys: []offload.Key{k("a2"), k("a3")}, Medium: offload.MediumCPU, Tier: "primary"},
			{Keys: []offload.Key{k("a4")}, Medium: offload.MediumStorage, Removed: true, Tier: "disk"},
		},
		"shared": {
			{Keys: []offload.Key{k("b1")}, Medium: offload.MediumCPU, Tier: "primary"},
			{Keys: []offload.Key{k("x1")}, Medium: offload.MediumCPU, Tier: "primary"},
		},
	}
	if !reflect.DeepEqual(parts, want) {
		t.Fatalf("parts %v\nwant %v", parts, want)
	}
}
