package tiering

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// PrepareStoreInto answers like PrepareStore, reusing the caller's output:
// new keys and their slots, an empty output when every key is present,
// and errors (with an empty output) for unknown or finished requests.
func TestPrepareStoreInto(t *testing.T) {
	f := newFixture(t)
	req := reqWith("r", nil, nil)
	f.m.OnNewRequest(req)
	var out offload.PrepareStoreOutput
	ok, err := f.m.PrepareStoreInto(keyRange(0, 3), req, &out)
	if err != nil || !ok || !slices.Equal(out.KeysToStore, keyRange(0, 3)) || len(out.Slots) != 3 {
		t.Fatalf("first store: ok=%v err=%v out=%+v", ok, err, out)
	}
	if err := f.m.CompleteStore(out.KeysToStore, req, true); err != nil {
		t.Fatal(err)
	}
	first := &out.KeysToStore[0]
	ok, err = f.m.PrepareStoreInto(keyRange(2, 4), req, &out)
	if err != nil || !ok || !slices.Equal(out.KeysToStore, keyRange(3, 4)) {
		t.Fatalf("second store: ok=%v err=%v out=%+v", ok, err, out)
	}
	if &out.KeysToStore[0] != first {
		t.Error("output array not reused")
	}
	ok, err = f.m.PrepareStoreInto(keyRange(0, 2), req, &out)
	if err != nil || !ok || len(out.KeysToStore)+len(out.Slots)+len(out.Evicted) != 0 {
		t.Fatalf("present keys: ok=%v err=%v out=%+v", ok, err, out)
	}
	out.KeysToStore = keyRange(0, 1)
	if ok, err := f.m.PrepareStoreInto(keyRange(5, 6), reqWith("unknown", nil, nil), &out); ok || !errors.Is(err, ErrUnknownRequest) || len(out.KeysToStore) != 0 {
		t.Fatalf("unknown request: ok=%v err=%v out=%+v", ok, err, out)
	}
	f.m.OnRequestFinished(req)
	if ok, err := f.m.PrepareStoreInto(keyRange(5, 6), req, &out); ok || err == nil {
		t.Fatalf("finished request: ok=%v err=%v", ok, err)
	}
}
