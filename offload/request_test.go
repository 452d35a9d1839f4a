package offload_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

type declaredTier struct {
	name string
	m    offload.Medium
	l    offload.Locality
}

// exampleTiers is a stack of the four kinds of declarations: fixed on
// both axes, and dynamic on both (a peer tier enforces filters itself).
var exampleTiers = []declaredTier{
	{"fs", storage, local},
	{"s3", storage, remote},
	{"redis", cpu, remote},
	{"peer", anyM, anyL},
}

func allowed(f *offload.TierFilter) []string {
	out := []string{}
	for _, t := range exampleTiers {
		if f.Allows(t.m, t.l) {
			out = append(out, t.name)
		}
	}
	return out
}

// TestDesignExamples runs the design's "Examples" against the declared
// tiers: which secondary tiers a request loads from and stores to.
func TestDesignExamples(t *testing.T) {
	everyTier := []string{"fs", "s3", "redis", "peer"}
	cases := []struct {
		name        string
		parser      offload.Parser
		params      string
		load, store []string
	}{
		{name: "primary only", params: `{"kv_load_tiers":[]}`,
			load: []string{}, store: everyTier},
		{name: "CPU tiers everywhere", params: `{"kv_load_tiers":[{"medium":"cpu"}]}`,
			load: []string{"redis", "peer"}, store: everyTier},
		{name: "everything local", params: `{"kv_load_tiers":[{"locality":"local"}]}`,
			load: []string{"fs", "peer"}, store: everyTier},
		{name: "remote CPU + local storage", params: `{"kv_load_tiers":[{"medium":"cpu","locality":"remote"},{"medium":"storage","locality":"local"}]}`,
			load: []string{"fs", "redis", "peer"}, store: everyTier},
		{name: "store to storage only", params: `{"kv_store_tiers":[{"medium":"storage"}]}`,
			load: everyTier, store: []string{"fs", "s3", "peer"}},
		{name: "default", params: `{}`,
			load: everyTier, store: everyTier},
		{name: "default without params", params: ``,
			load: everyTier, store: everyTier},
		{name: "server default: no promotion unless asked", parser: offload.Parser{DefaultLoad: offload.NewTierFilter()},
			params: `{}`, load: []string{}, store: everyTier},
		{name: "server default overridden by request", parser: offload.Parser{DefaultLoad: offload.NewTierFilter()},
			params: `{"kv_load_tiers":[{"medium":"cpu"}]}`, load: []string{"redis", "peer"}, store: everyTier},
		{name: "both filters", params: `{"kv_load_tiers":[{"locality":"global"}],"kv_store_tiers":[]}`,
			load: []string{"s3", "redis", "peer"}, store: []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc, err := c.parser.NewReqContext("req", []byte(c.params))
			if err != nil {
				t.Fatal(err)
			}
			if got := allowed(rc.LoadFilter); !slices.Equal(got, c.load) {
				t.Errorf("load from %v, want %v", got, c.load)
			}
			if got := allowed(rc.StoreFilter); !slices.Equal(got, c.store) {
				t.Errorf("store to %v, want %v", got, c.store)
			}
		})
	}
}

// TestServerDefaults: a default applies only when the key is missing or
// null; anything the request sends, even [] or an invalid value, wins.
func TestServerDefaults(t *testing.T) {
	defLoad := offload.NewTierFilter(M(storage, anyL))
	defStore := offload.NewTierFilter(M(cpu, anyL))
	p := offload.Parser{DefaultLoad: defLoad, DefaultStore: defStore}
	cases := []struct {
		name               string
		params             any
		load, store        *offload.TierFilter
		loadReq, storeReq  bool
		loadAll, storeAll  bool // want the All sentinel itself
		wantWarningReasons []string
	}{
		{name: "no params", params: nil, load: defLoad, store: defStore},
		{name: "empty object", params: `{}`, load: defLoad, store: defStore},
		{name: "explicit nulls", params: `{"kv_load_tiers":null,"kv_store_tiers":null}`, load: defLoad, store: defStore},
		{name: "decoded map with nil", params: map[string]any{"kv_load_tiers": nil}, load: defLoad, store: defStore},
		{name: "explicit [] overrides", params: `{"kv_load_tiers":[],"kv_store_tiers":[]}`,
			load: offload.NewTierFilter(), store: offload.NewTierFilter(), loadReq: true, storeReq: true},
		{name: "only load sent", params: `{"kv_load_tiers":[{"locality":"local"}]}`,
			load: offload.NewTierFilter(M(anyM, local)), store: defStore, loadReq: true},
		{name: "only store sent", params: `{"kv_store_tiers":[{}]}`,
			load: defLoad, store: offload.NewTierFilter(M(anyM, anyL)), storeReq: true},
		{name: "invalid value fails open to All, not the default", params: `{"kv_load_tiers":"cpu"}`,
			loadAll: true, store: defStore, loadReq: true, wantWarningReasons: []string{offload.ReasonNotList}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc, err := p.NewReqContext("r", c.params)
			if err != nil {
				t.Fatal(err)
			}
			if c.loadAll {
				if !rc.LoadFilter.IsAll() {
					t.Errorf("load = %v, want All", rc.LoadFilter)
				}
			} else if rc.LoadFilter.IsAll() || !rc.LoadFilter.Equal(c.load) {
				t.Errorf("load = %v, want %v", rc.LoadFilter, c.load)
			}
			if c.storeAll {
				if !rc.StoreFilter.IsAll() {
					t.Errorf("store = %v, want All", rc.StoreFilter)
				}
			} else if rc.StoreFilter.IsAll() || !rc.StoreFilter.Equal(c.store) {
				t.Errorf("store = %v, want %v", rc.StoreFilter, c.store)
			}
			if rc.LoadFromRequest != c.loadReq || rc.StoreFromRequest != c.storeReq {
				t.Errorf("fromRequest = %v/%v, want %v/%v", rc.LoadFromRequest, rc.StoreFromRequest, c.loadReq, c.storeReq)
			}
			if got := reasons(rc.Warnings); !slices.Equal(got, c.wantWarningReasons) {
				t.Errorf("warnings %v, want %v", got, c.wantWarningReasons)
			}
		})
	}
}

// TestStrictMode: any invalid part is an error wrapping ErrInvalidFilter
// that names the field, the entry index and the value; valid filters pass.
func TestStrictMode(t *testing.T) {
	p := offload.Parser{Mode: offload.Strict, OnWarning: func(w offload.Warning) {
		t.Errorf("OnWarning called in strict mode: %v", w)
	}}
	cases := []struct {
		name   string
		params string
		reason string
		want   []string // substrings of the error
	}{
		{"not a list", `{"kv_load_tiers":"cpu"}`, offload.ReasonNotList, []string{"kv_load_tiers", `"cpu"`, "list"}},
		{"object not list", `{"kv_store_tiers":{"medium":"cpu"}}`, offload.ReasonNotList, []string{"kv_store_tiers", `{"medium":"cpu"}`}},
		{"entry not object", `{"kv_load_tiers":[{"medium":"cpu"},"x"]}`, offload.ReasonEntryNotObject, []string{"kv_load_tiers[1]", `"x"`}},
		{"unknown medium", `{"kv_load_tiers":[{"medium":"cpu"},{},{"medium":"bogus"}]}`, offload.ReasonUnknownMedium, []string{"kv_load_tiers[2]", "medium", `"bogus"`}},
		{"numeric medium", `{"kv_load_tiers":[{"medium":5}]}`, offload.ReasonUnknownMedium, []string{"kv_load_tiers[0]", "medium", "5"}},
		{"unknown locality", `{"kv_store_tiers":[{"locality":"nowhere"}]}`, offload.ReasonUnknownLocality, []string{"kv_store_tiers[0]", "locality", `"nowhere"`}},
		{"valid load, bad store", `{"kv_load_tiers":[],"kv_store_tiers":[{"medium":"disk"}]}`, offload.ReasonUnknownMedium, []string{"kv_store_tiers[0]", `"disk"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc, err := p.NewReqContext("r", c.params)
			if err == nil {
				t.Fatalf("no error, got context %+v", rc)
			}
			if rc != nil {
				t.Errorf("context returned with the error")
			}
			if !errors.Is(err, offload.ErrInvalidFilter) {
				t.Errorf("error %v does not wrap ErrInvalidFilter", err)
			}
			var fe *offload.FilterError
			if !errors.As(err, &fe) || fe.Warning.Reason != c.reason {
				t.Errorf("error %v: want FilterError with reason %s", err, c.reason)
			}
			for _, s := range c.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
	for _, ok := range []string{`{}`, `{"kv_load_tiers":null}`, `{"kv_load_tiers":[]}`,
		`{"kv_load_tiers":[{"medium":"CPU","locality":"Global","extra":1}],"kv_store_tiers":[{}]}`} {
		if _, err := p.NewReqContext("r", ok); err != nil {
			t.Errorf("strict rejects valid %s: %v", ok, err)
		}
	}
}

func TestParseValidationMode(t *testing.T) {
	for in, want := range map[string]offload.ValidationMode{
		"": offload.Lenient, "lenient": offload.Lenient, "LeNiEnT": offload.Lenient,
		"strict": offload.Strict, "STRICT": offload.Strict, "sTrict": offload.Strict,
	} {
		got, err := offload.ParseValidationMode(in)
		if err != nil || got != want {
			t.Errorf("ParseValidationMode(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && !strings.EqualFold(got.String(), in) {
			t.Errorf("String() = %q for %q", got, in)
		}
	}
	for _, bad := range []string{"strictly", " strict", "off"} {
		if _, err := offload.ParseValidationMode(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseValidationMode(%q) err = %v", bad, err)
		}
	}
}

func TestGlobalIsRemote(t *testing.T) {
	remoteF := offload.NewTierFilter(M(anyM, remote))
	for _, v := range []string{"global", "GLOBAL", "Global", "remote", "REMOTE"} {
		f, ws := offload.ParseTierFilter(offload.KeyLoadTiers, decode(t, `[{"locality":"`+v+`"}]`))
		if len(ws) != 0 || !f.Equal(remoteF) {
			t.Errorf("%s: got %v %v, want %v", v, f, ws, remoteF)
		}
	}
	if l, ok := offload.ParseLocality("global"); !ok || l != remote {
		t.Errorf("ParseLocality(global) = %v, %v", l, ok)
	}
	if _, ok := offload.ParseMedium("global"); ok {
		t.Error("global accepted as a medium")
	}
}

// TestParamsInputForms: JSON bytes, a JSON string, json.RawMessage and a
// decoded map give the same filters, and the params as JSON (none for Go
// values with no JSON form); the caller's map is kept untouched.
func TestParamsInputForms(t *testing.T) {
	const doc = `{"kv_load_tiers":[{"medium":"cpu"},"x"],"kv_store_tiers":[{"locality":"local"}],"other":{"k":1}}`
	var decoded map[string]any
	if err := json.Unmarshal([]byte(doc), &decoded); err != nil {
		t.Fatal(err)
	}
	typed := map[string]any{
		"kv_load_tiers":  []map[string]string{{"medium": "cpu"}},
		"kv_store_tiers": []any{map[any]any{"locality": "local"}},
	}
	wantLoad := offload.NewTierFilter(M(cpu, anyL))
	wantStore := offload.NewTierFilter(M(anyM, local))
	for name, in := range map[string]any{
		"bytes": []byte(doc), "string": doc, "raw message": json.RawMessage(doc),
		"decoded map": decoded, "typed Go values": typed,
		"surrounding whitespace": "\n\t " + doc + " \n",
	} {
		t.Run(name, func(t *testing.T) {
			rc, err := offload.NewReqContext("id-1", in)
			if err != nil {
				t.Fatal(err)
			}
			if rc.ID != "id-1" || (len(rc.Params) == 0) != (name == "typed Go values") {
				t.Fatalf("ID %q params %v", rc.ID, rc.Params)
			}
			if !rc.LoadFilter.Equal(wantLoad) || !rc.StoreFilter.Equal(wantStore) {
				t.Fatalf("filters %v / %v", rc.LoadFilter, rc.StoreFilter)
			}
		})
	}
	rc, err := offload.NewReqContext("r", decoded)
	if err != nil {
		t.Fatal(err)
	}
	var other map[string]any
	if ok, err := rc.Param("other", &other); !ok || err != nil || other["k"] != float64(1) {
		t.Fatalf("params not passed through: %s (%v, %v)", rc.Params, ok, err)
	}
	if ok, err := rc.Param("absent", &other); ok || err != nil {
		t.Fatalf("absent key: %v, %v", ok, err)
	}
	if len(decoded["kv_load_tiers"].([]any)) != 2 {
		t.Fatal("parser modified the caller's map")
	}
}

func TestInvalidParams(t *testing.T) {
	for name, in := range map[string]any{
		"not json":          "kv_load_tiers",
		"truncated":         `{"kv_load_tiers":[`,
		"array":             `[{"medium":"cpu"}]`,
		"json string":       `"x"`,
		"number":            `5`,
		"trailing value":    `{} {}`,
		"trailing bracket":  `{"a":1}]`,
		"trailing brace":    `{"a":1}}`,
		"trailing garbage":  `{"a":1} x`,
		"unsupported type":  42,
		"typed map":         map[string]string{"kv_load_tiers": "[]"},
		"invalid bytes":     []byte{0xff, 0xfe},
		"deeply nested":     strings.Repeat("[", 20000),
		"deeply nested obj": `{"a":` + strings.Repeat(`{"a":`, 20000),
	} {
		t.Run(name, func(t *testing.T) {
			rc, err := offload.NewReqContext("r", in)
			if !errors.Is(err, offload.ErrInvalidParams) {
				t.Fatalf("err = %v (ctx %v), want ErrInvalidParams", err, rc)
			}
			if rc != nil {
				t.Fatal("context returned with the error")
			}
		})
	}
}

// TestWarningMessages pins the text of the four warnings (users grep logs
// and kvtier explain prints them) and that OnWarning sees each in order.
func TestWarningMessages(t *testing.T) {
	var seen []offload.Warning
	p := offload.Parser{OnWarning: func(w offload.Warning) { seen = append(seen, w) }}
	rc, err := p.NewReqContext("r", `{"kv_load_tiers":[{"medium":"cpu"},"x",{"medium":"bogus"},{"locality":"nowhere"}],"kv_store_tiers":"all"}`)
	if err != nil {
		t.Fatal(err)
	}
	want := []offload.Warning{
		{Field: "kv_load_tiers", Reason: offload.ReasonEntryNotObject, Entry: 1, Value: `"x"`,
			Message: `kv_load_tiers[1]: entry is not an object (got string); skipping`},
		{Field: "kv_load_tiers", Reason: offload.ReasonUnknownMedium, Entry: 2, Value: `"bogus"`,
			Message: `kv_load_tiers[2]: unknown medium "bogus"; skipping entry`},
		{Field: "kv_load_tiers", Reason: offload.ReasonUnknownLocality, Entry: 3, Value: `"nowhere"`,
			Message: `kv_load_tiers[3]: unknown locality "nowhere"; skipping entry`},
		{Field: "kv_store_tiers", Reason: offload.ReasonNotList, Entry: -1, Value: `"all"`,
			Message: `kv_store_tiers: expected list, got string; ignoring`},
	}
	if !slices.Equal(rc.Warnings, want) {
		t.Errorf("Warnings =\n%v\nwant\n%v", rc.Warnings, want)
	}
	if !slices.Equal(seen, want) {
		t.Errorf("OnWarning saw\n%v\nwant\n%v", seen, want)
	}
	if !rc.LoadFilter.Equal(offload.NewTierFilter(M(cpu, anyL))) || !rc.StoreFilter.IsAll() {
		t.Errorf("filters %v / %v", rc.LoadFilter, rc.StoreFilter)
	}
}

// TestWarningValueBounded: a hostile value cannot make a huge log line,
// and truncation keeps the message valid UTF-8.
func TestWarningValueBounded(t *testing.T) {
	long := strings.Repeat("é", 500)
	_, ws := offload.ParseTierFilter(offload.KeyLoadTiers, []any{map[string]any{"medium": long}, long})
	if len(ws) != 2 {
		t.Fatalf("warnings %v", ws)
	}
	for _, w := range ws {
		if len(w.Message) > 200 || len(w.Value) > 80 {
			t.Errorf("unbounded warning (%d bytes): %s", len(w.Message), w.Message)
		}
		if !strings.HasSuffix(w.Value, "…") || !utf8Valid(w.Message) {
			t.Errorf("bad truncation: %q", w.Value)
		}
	}
	_, ws = offload.ParseTierFilter(offload.KeyLoadTiers, []any{map[string]any{"medium": "<&>"}})
	if ws[0].Value != `"<&>"` {
		t.Errorf("value rendered as %s", ws[0].Value)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestReqContextState(t *testing.T) {
	type keyA struct{}
	type keyB struct{}
	rc := offload.Background("bg")
	if !rc.LoadFilter.IsAll() || !rc.StoreFilter.IsAll() || rc.Params != nil || rc.ID != "bg" {
		t.Fatalf("Background = %+v", rc)
	}
	if rc.State(keyA{}) != nil {
		t.Fatal("fresh state not empty")
	}
	rc.SetState(keyA{}, 1)
	rc.SetState(keyB{}, "b")
	if rc.State(keyA{}) != 1 || rc.State(keyB{}) != "b" {
		t.Fatal("state lost")
	}
}
