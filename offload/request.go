package offload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"
)

// Request parameter keys read from kv_transfer_params.
const (
	KeyLoadTiers  = "kv_load_tiers"
	KeyStoreTiers = "kv_store_tiers"
	matcherMedium = "medium"
	matcherLocal  = "locality"
)

// ValidationMode says what happens to a request whose filter has invalid
// parts (docs/design.md §3).
type ValidationMode uint8

// Validation modes.
const (
	// Lenient follows upstream: warn, skip bad entries, fail open to All.
	Lenient ValidationMode = iota
	// Strict rejects the request with an error naming the bad entry.
	Strict
)

// String returns "lenient" or "strict".
func (m ValidationMode) String() string {
	if m == Strict {
		return "strict"
	}
	return "lenient"
}

// ParseValidationMode maps "lenient" / "strict" (case-insensitive; "" is
// lenient) to a ValidationMode.
func ParseValidationMode(s string) (ValidationMode, error) {
	switch strings.ToLower(s) {
	case "", "lenient":
		return Lenient, nil
	case "strict":
		return Strict, nil
	}
	return Lenient, fmt.Errorf("validation mode %q: want lenient or strict", s)
}

// Warning reasons, stable identifiers for metrics.
const (
	ReasonNotList         = "not_list"
	ReasonEntryNotObject  = "entry_not_object"
	ReasonUnknownMedium   = "unknown_medium"
	ReasonUnknownLocality = "unknown_locality"
)

// Warning is one problem found while parsing a tier filter. Entry is the
// index of the offending list entry, or -1 for the field as a whole.
//
// Message carries upstream's four _parse_tier_filter texts (docs/semantics.md §2.1)
// adapted to JSON: the field and entry index ("kv_load_tiers[2]: ") stand
// where upstream names its function, so that kv_load_tiers and
// kv_store_tiers problems can be told apart; types and values are written
// as JSON ("string", "bogus" in double quotes) rather than Python's str
// and repr; and a non-object entry reads "entry is not an object (got
// T); skipping" where upstream says "entry is not a dict; skipping".
type Warning struct {
	Field   string // kv_load_tiers or kv_store_tiers
	Reason  string // one of the Reason* constants
	Entry   int
	Value   string // JSON rendering of the offending value
	Message string
}

func (w Warning) String() string { return w.Message }

// ErrInvalidFilter is wrapped by every strict-mode filter error.
var ErrInvalidFilter = errors.New("invalid tier filter")

// ErrInvalidParams reports kv_transfer_params that are not a JSON object.
var ErrInvalidParams = errors.New("invalid kv_transfer_params")

// FilterError is the strict-mode error for a filter with an invalid part.
type FilterError struct{ Warning Warning }

// Error names the field, the entry index (when the problem is one entry)
// and the offending value, e.g.
// `invalid tier filter: kv_load_tiers[2]: unknown medium "bogus"`.
func (e *FilterError) Error() string {
	w := e.Warning
	where := w.Field
	if w.Entry >= 0 {
		where = fmt.Sprintf("%s[%d]", w.Field, w.Entry)
	}
	var what string
	switch w.Reason {
	case ReasonNotList:
		what = "expected a list, got " + w.Value
	case ReasonEntryNotObject:
		what = "entry is not an object: " + w.Value
	case ReasonUnknownMedium:
		what = "unknown medium " + w.Value + " (want cpu or storage)"
	case ReasonUnknownLocality:
		what = "unknown locality " + w.Value + " (want local, remote or global)"
	default:
		what = w.Message
	}
	return fmt.Sprintf("%v: %s: %s", ErrInvalidFilter, where, what)
}

// Unwrap lets callers test errors.Is(err, ErrInvalidFilter).
func (e *FilterError) Unwrap() error { return ErrInvalidFilter }

// ParseTierFilter parses the value of a filter field (kv_load_tiers or
// kv_store_tiers) exactly as docs/semantics.md §2.1: a non-list is All with a warning;
// non-object entries and entries with an unknown medium or locality are
// skipped with a warning; [] denies every secondary tier; a non-empty list
// with no valid entry fails open to All. Values are case-insensitive and
// "global" is a synonym of "remote". raw is a decoded JSON value (nil,
// bool, float64 or json.Number, string, []any, map[string]any); other
// Go slices, maps with string keys and map[any]any with only string keys
// (as some YAML and CBOR decoders produce) are read the same way.
func ParseTierFilter(field string, raw any) (*TierFilter, []Warning) {
	entries, ok := asList(raw)
	if !ok {
		return All(), []Warning{{
			Field: field, Reason: ReasonNotList, Entry: -1, Value: render(raw),
			Message: fmt.Sprintf("%s: expected list, got %s; ignoring", field, jsonTypeName(raw)),
		}}
	}
	var warns []Warning
	matchers := make([]TierMatcher, 0, len(entries))
	for i, e := range entries {
		obj, ok := asObject(e)
		if !ok {
			warns = append(warns, Warning{
				Field: field, Reason: ReasonEntryNotObject, Entry: i, Value: render(e),
				Message: fmt.Sprintf("%s[%d]: entry is not an object (got %s); skipping", field, i, jsonTypeName(e)),
			})
			continue
		}
		var m TierMatcher
		if v, present := obj[matcherMedium]; present && v != nil {
			s, isStr := v.(string)
			med, valid := ParseMedium(s)
			if !isStr || !valid {
				warns = append(warns, Warning{
					Field: field, Reason: ReasonUnknownMedium, Entry: i, Value: render(v),
					Message: fmt.Sprintf("%s[%d]: unknown medium %s; skipping entry", field, i, render(v)),
				})
				continue
			}
			m.Medium = med
		}
		if v, present := obj[matcherLocal]; present && v != nil {
			s, isStr := v.(string)
			loc, valid := ParseLocality(s)
			if !isStr || !valid {
				warns = append(warns, Warning{
					Field: field, Reason: ReasonUnknownLocality, Entry: i, Value: render(v),
					Message: fmt.Sprintf("%s[%d]: unknown locality %s; skipping entry", field, i, render(v)),
				})
				continue
			}
			m.Locality = loc
		}
		matchers = append(matchers, m)
	}
	if len(matchers) == 0 && len(entries) > 0 {
		return All(), warns
	}
	return NewTierFilter(matchers...), warns
}

func asList(v any) ([]any, bool) {
	switch l := v.(type) {
	case nil:
		return nil, false
	case []any:
		return l, true
	case string, []byte, json.RawMessage:
		// A string is not a list; raw bytes are a JSON document that was
		// not decoded, which we do not guess at.
		return nil, false
	}
	// Other typed slices ([]map[string]any, []map[string]string, a
	// decoder's own list type) hold entries just the same.
	rv := reflect.ValueOf(v)
	if k := rv.Kind(); k != reflect.Slice && k != reflect.Array {
		return nil, false
	}
	if rv.Kind() == reflect.Slice && rv.IsNil() {
		return nil, false
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out, true
}

func asObject(v any) (map[string]any, bool) {
	switch o := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		return o, true
	case map[any]any:
		// CBOR and some YAML decoders produce these; an object for us only
		// if every key is a string.
		out := make(map[string]any, len(o))
		for k, e := range o {
			s, ok := k.(string)
			if !ok {
				return nil, false
			}
			out[s] = e
		}
		return out, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Map || rv.Type().Key().Kind() != reflect.String || rv.IsNil() {
		return nil, false
	}
	out := make(map[string]any, rv.Len())
	for it := rv.MapRange(); it.Next(); {
		out[it.Key().String()] = it.Value().Interface()
	}
	return out, true
}

// jsonTypeName names the JSON type of a decoded value for warnings.
func jsonTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, json.Number:
		return "number"
	}
	if _, ok := asObject(v); ok {
		return "object"
	}
	if _, ok := asList(v); ok {
		return "array"
	}
	return fmt.Sprintf("%T", v)
}

// render gives the JSON form of a value for messages, bounded in length
// so that a hostile request cannot blow up a log line, and cut on a rune
// boundary so that the message stays valid UTF-8.
func render(v any) string {
	const maxRender = 64
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	var b []byte
	if err := enc.Encode(v); err != nil {
		// Only Go-typed input gets here (a cycle, a NaN, a func); its
		// type is safer to print than its value.
		b = []byte(fmt.Sprintf("<%T>", v))
	} else {
		b = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	if len(b) <= maxRender {
		return string(b)
	}
	cut := maxRender
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "…"
}

// Parser builds request contexts with the server's defaults and
// validation mode. The zero value is upstream behaviour: lenient, and
// All for both filters when the request omits them.
type Parser struct {
	// DefaultLoad and DefaultStore apply when the request omits the key or
	// sends null. nil means All.
	DefaultLoad  *TierFilter
	DefaultStore *TierFilter
	Mode         ValidationMode
	// OnWarning, if set, is called for every warning of a lenient parse
	// (rate-limited logging and metrics hang off it, see WarningLog).
	OnWarning func(Warning)
}

// NewReqContext builds a request context with the zero Parser (lenient,
// no server defaults). params is JSON bytes, a JSON string, nil, or a
// decoded map.
func NewReqContext(reqID string, params any) (*ReqContext, error) {
	var p Parser
	return p.NewReqContext(reqID, params)
}

// NewReqContext parses params (JSON bytes or string, a decoded map, or nil)
// into a request context. It fails only for params that are not a JSON
// object, or, in strict mode, for a filter with an invalid part.
func (p *Parser) NewReqContext(reqID string, params any) (*ReqContext, error) {
	m, raw, err := decodeParams(params)
	if err != nil {
		return nil, err
	}
	rc := &ReqContext{ID: reqID, Params: raw}
	rc.LoadFilter, rc.LoadFromRequest, err = p.field(m, KeyLoadTiers, p.DefaultLoad, &rc.Warnings)
	if err != nil {
		return nil, err
	}
	rc.StoreFilter, rc.StoreFromRequest, err = p.field(m, KeyStoreTiers, p.DefaultStore, &rc.Warnings)
	if err != nil {
		return nil, err
	}
	return rc, nil
}

func (p *Parser) field(m map[string]any, key string, def *TierFilter, warns *[]Warning) (*TierFilter, bool, error) {
	raw, present := m[key]
	if !present || raw == nil {
		if def == nil {
			def = All()
		}
		return def, false, nil
	}
	f, ws := ParseTierFilter(key, raw)
	if len(ws) > 0 && p.Mode == Strict {
		return nil, true, &FilterError{Warning: ws[0]}
	}
	for _, w := range ws {
		if p.OnWarning != nil {
			p.OnWarning(w)
		}
	}
	*warns = append(*warns, ws...)
	return f, true, nil
}

// decodeParams returns params decoded (for the filters, then dropped) and
// as compact JSON (kept): a decoded document costs some 25 times its
// JSON's size.
func decodeParams(params any) (map[string]any, json.RawMessage, error) {
	m, err := decodeParamsMap(params)
	if err != nil || m == nil {
		return nil, nil, err
	}
	var raw []byte
	switch v := params.(type) {
	case []byte:
		raw = v
	case json.RawMessage:
		raw = v
	case string:
		raw = []byte(v)
	}
	var buf bytes.Buffer
	if raw == nil || json.Compact(&buf, raw) != nil {
		buf.Reset()
		b, err := json.Marshal(m)
		if err != nil {
			// A Go map with no JSON form (map[any]any values): the
			// filters were read from it, tiers see no params.
			return m, nil, nil
		}
		buf.Write(b)
	}
	return m, json.RawMessage(buf.Bytes()), nil
}

func decodeParamsMap(params any) (map[string]any, error) {
	var data []byte
	switch v := params.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return v, nil
	case json.RawMessage:
		data = v
	case []byte:
		data = v
	case string:
		data = []byte(v)
	default:
		return nil, fmt.Errorf("%w: unsupported Go type %T", ErrInvalidParams, params)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidParams, err)
	}
	// dec.More would accept a stray closing bracket; only EOF may follow.
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON value", ErrInvalidParams)
	}
	switch o := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return o, nil
	default:
		return nil, fmt.Errorf("%w: want a JSON object, got %s", ErrInvalidParams, jsonTypeName(v))
	}
}

// ReqContext is the per-request context built once from kv_transfer_params
// and passed to every manager and tier call of that request (docs/semantics.md §1.6).
// Like the manager, it is used by one goroutine at a time.
type ReqContext struct {
	ID string
	// Params is the request's kv_transfer_params as compact JSON, so that
	// tiers can read their own keys (Param). nil when the request sent
	// none, or for a Go map with no JSON form. It is kept as JSON, not
	// decoded: bounded by the daemon's limits, it is what a request costs.
	Params json.RawMessage
	// LoadFilter gates lookups and promotions from secondary tiers;
	// StoreFilter gates cascades to them. Never nil.
	LoadFilter  *TierFilter
	StoreFilter *TierFilter
	// LoadFromRequest / StoreFromRequest are false when the server
	// default applied because the request omitted the key or sent null.
	LoadFromRequest  bool
	StoreFromRequest bool
	// Warnings lists every problem found in the request's filters.
	Warnings []Warning

	state map[any]any
}

// Param decodes the top-level key of the request's kv_transfer_params
// into v and reports whether the key is present (and not null).
func (r *ReqContext) Param(key string, v any) (bool, error) {
	if len(r.Params) == 0 {
		return false, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(r.Params, &m); err != nil {
		return false, fmt.Errorf("%w: %v", ErrInvalidParams, err)
	}
	raw, ok := m[key]
	if !ok || string(raw) == "null" {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("%w: %s: %v", ErrInvalidParams, key, err)
	}
	return true, nil
}

// State returns the per-request scratch value stored under key (nil if
// none). Tiers use a private key type so they cannot collide.
func (r *ReqContext) State(key any) any { return r.state[key] }

// SetState stores per-request scratch state under key.
func (r *ReqContext) SetState(key, v any) {
	if r.state == nil {
		r.state = make(map[any]any)
	}
	r.state[key] = v
}

// Background returns a context for internally generated work (promotions
// on behalf of peers, maintenance): no params, both filters All.
func Background(reqID string) *ReqContext {
	return &ReqContext{ID: reqID, LoadFilter: All(), StoreFilter: All()}
}
