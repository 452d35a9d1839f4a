package offload_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// fuzzSeeds are whole kv_transfer_params documents: every acceptance case
// under both keys, plus shapes that stress the decoder.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	for _, c := range acceptanceCases {
		seeds = append(seeds,
			[]byte(`{"kv_load_tiers":`+c.raw+`}`),
			[]byte(`{"kv_store_tiers":`+c.raw+`,"kv_load_tiers":[{"medium":"cpu"}]}`))
	}
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `"x"`, `5`, `{} {}`, `{"a":1}]`, `{"kv_load_tiers":null}`,
		`{"kv_load_tiers":[{"locality":"global"}],"kv_store_tiers":[]}`,
		`{"kv_load_tiers":[{"medium":1e999}]}`,
		`{"kv_load_tiers":[{"medium":"ſtorage"}]}`,
		`{"kv_load_tiers":[{"medium":"cpu","medium":"bogus"}]}`,
		`{"kv_load_tiers":[{"medium":"\u0063pu","locality":"LOCAL"}]}`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// refParamsOK says whether params must parse: empty, JSON null or a JSON
// object, with nothing but whitespace around it.
func refParamsOK(data []byte) bool {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return true
	}
	return json.Valid(data) && (trimmed[0] == '{' || string(trimmed) == "null")
}

// refFilter re-derives docs/semantics.md §2.1 for one field, independently of the
// package: all reports the All fallback, otherwise matchers is exactly
// the valid entries in order; warnings is the number of problems.
func refFilter(params map[string]any, key string) (all bool, matchers []offload.TierMatcher, warnings int) {
	raw, present := params[key]
	if !present || raw == nil {
		return true, nil, 0
	}
	list, ok := raw.([]any)
	if !ok {
		return true, nil, 1
	}
	matchers = []offload.TierMatcher{}
	for _, e := range list {
		obj, ok := e.(map[string]any)
		if !ok {
			warnings++
			continue
		}
		var m offload.TierMatcher
		if v := obj["medium"]; v != nil {
			s, _ := v.(string)
			switch strings.ToUpper(s) {
			case "CPU":
				m.Medium = offload.MediumCPU
			case "STORAGE":
				m.Medium = offload.MediumStorage
			default:
				warnings++
				continue
			}
		}
		if v := obj["locality"]; v != nil {
			s, _ := v.(string)
			switch strings.ToUpper(s) {
			case "LOCAL":
				m.Locality = offload.LocalityLocal
			case "REMOTE", "GLOBAL":
				m.Locality = offload.LocalityRemote
			default:
				warnings++
				continue
			}
		}
		matchers = append(matchers, m)
	}
	if len(matchers) == 0 && len(list) > 0 {
		return true, nil, warnings
	}
	return false, matchers, warnings
}

// refAllows is docs/semantics.md §1.4–§1.5 written out directly.
func refAllows(matchers []offload.TierMatcher, m offload.Medium, l offload.Locality) bool {
	for _, tm := range matchers {
		mOK := tm.Medium == 0 || m == 0 || tm.Medium == m
		lOK := tm.Locality == 0 || l == 0 || tm.Locality == l
		if mOK && lOK {
			return true
		}
	}
	return false
}

func checkAgainstRef(t *testing.T, key string, f *offload.TierFilter, all bool, matchers []offload.TierMatcher) {
	t.Helper()
	if f == nil {
		t.Fatalf("%s: nil filter", key)
	}
	if all {
		if !f.IsAll() {
			t.Fatalf("%s: got %v, want All", key, f)
		}
		return
	}
	if f.IsAll() {
		t.Fatalf("%s: got All, want %v", key, matchers)
	}
	if got := f.Matchers(); !slices.Equal(got, matchers) && !(len(got) == 0 && len(matchers) == 0) {
		t.Fatalf("%s: matchers %v, want %v", key, got, matchers)
	}
	for _, m := range media {
		for _, l := range localities {
			if got, want := f.Allows(m, l), refAllows(matchers, m, l); got != want {
				t.Fatalf("%s: %v.Allows(%q,%q) = %v, want %v", key, f, m, l, got, want)
			}
		}
	}
}

// FuzzNewReqContext: arbitrary bytes never panic; valid params give, per
// field, All or exactly the valid entries; anything else is
// ErrInvalidParams.
func FuzzNewReqContext(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rc, err := offload.NewReqContext("fuzz", data)
		if !refParamsOK(data) {
			if !errors.Is(err, offload.ErrInvalidParams) || rc != nil {
				t.Fatalf("invalid params accepted: %v %v", rc, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid params rejected: %v", err)
		}
		var params map[string]any
		if len(bytes.TrimSpace(data)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.UseNumber()
			if err := dec.Decode(&params); err != nil {
				t.Fatalf("reference decode: %v", err)
			}
		}
		lAll, lM, lW := refFilter(params, offload.KeyLoadTiers)
		sAll, sM, sW := refFilter(params, offload.KeyStoreTiers)
		checkAgainstRef(t, offload.KeyLoadTiers, rc.LoadFilter, lAll, lM)
		checkAgainstRef(t, offload.KeyStoreTiers, rc.StoreFilter, sAll, sM)
		if len(rc.Warnings) != lW+sW {
			t.Fatalf("%d warnings %v, want %d", len(rc.Warnings), rc.Warnings, lW+sW)
		}
		for _, w := range rc.Warnings {
			if len(w.Message) > 256 || w.Reason == "" {
				t.Fatalf("bad warning %+v", w)
			}
		}
	})
}

// FuzzParseTierFilterStrictLenientAgree: strict mode errors exactly when
// lenient mode warns, reports lenient's first warning, and otherwise
// builds the same filters.
func FuzzParseTierFilterStrictLenientAgree(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var warned int
		lenient := offload.Parser{OnWarning: func(offload.Warning) { warned++ }}
		strict := offload.Parser{Mode: offload.Strict}
		lrc, lerr := lenient.NewReqContext("l", data)
		src, serr := strict.NewReqContext("s", data)
		if lerr != nil {
			if !errors.Is(lerr, offload.ErrInvalidParams) || !errors.Is(serr, offload.ErrInvalidParams) {
				t.Fatalf("lenient %v, strict %v", lerr, serr)
			}
			return
		}
		if warned != len(lrc.Warnings) {
			t.Fatalf("OnWarning called %d times for %d warnings", warned, len(lrc.Warnings))
		}
		if len(lrc.Warnings) > 0 {
			var fe *offload.FilterError
			if !errors.As(serr, &fe) || !errors.Is(serr, offload.ErrInvalidFilter) || src != nil {
				t.Fatalf("lenient warned %v, strict returned %v, %v", lrc.Warnings, src, serr)
			}
			if fe.Warning != lrc.Warnings[0] {
				t.Fatalf("strict reports %+v, lenient's first warning is %+v", fe.Warning, lrc.Warnings[0])
			}
			if !strings.Contains(serr.Error(), fe.Warning.Field) || !strings.Contains(serr.Error(), fe.Warning.Value) {
				t.Fatalf("strict error %q does not name field and value", serr)
			}
			return
		}
		if serr != nil {
			t.Fatalf("strict error %v without lenient warnings", serr)
		}
		if lrc.LoadFilter.IsAll() != src.LoadFilter.IsAll() || !lrc.LoadFilter.Equal(src.LoadFilter) ||
			lrc.StoreFilter.IsAll() != src.StoreFilter.IsAll() || !lrc.StoreFilter.Equal(src.StoreFilter) {
			t.Fatalf("filters differ: %v/%v vs %v/%v", lrc.LoadFilter, lrc.StoreFilter, src.LoadFilter, src.StoreFilter)
		}
	})
}
