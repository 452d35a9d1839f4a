package config

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/kvtier/kvtier/confvalue"
	"go.yaml.in/yaml/v3"
)

// TierSpec is one entry of secondary_tiers: its name, its type, and the
// type-specific keys, kept undecoded until the package that builds tiers
// of that type decodes them with Decode.
type TierSpec struct {
	// Name is unique among the secondary tiers; when the config omits it,
	// it defaults to the type followed by the entry's index ("memory0").
	Name string
	// Type is the tier type in lower case (memory, fs, s3, redis, peer).
	Type string
	// Index is the entry's position in secondary_tiers (lookup priority).
	Index int

	file     string
	path     string // secondary_tiers[i]
	line     int
	nameLine int
	params   yaml.Node // mapping of the type-specific keys; Kind 0 when none
}

// Path returns the entry's key path, e.g. "secondary_tiers[1]".
func (t TierSpec) Path() string { return t.path }

// Has reports whether the entry sets the type-specific key.
func (t TierSpec) Has(key string) bool { return t.value(key) != nil }

func (t TierSpec) value(key string) *yaml.Node {
	for i := 0; i+1 < len(t.params.Content); i += 2 {
		if t.params.Content[i].Value == key {
			return t.params.Content[i+1]
		}
	}
	return nil
}

// Value returns the scalar value of a type-specific key ("" when absent
// or not a scalar).
func (t TierSpec) Value(key string) string {
	if vn := t.value(key); vn != nil && vn.Kind == yaml.ScalarNode {
		return vn.Value
	}
	return ""
}

// With returns a copy of t whose type-specific key is set to the string
// value (added when absent); t is unchanged. Tools use it to run a
// configured tier somewhere else, e.g. an fs tier in a scratch directory.
func (t TierSpec) With(key, value string) TierSpec {
	out := t
	out.params = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: t.params.Line, Column: t.params.Column}
	set := false
	for i := 0; i+1 < len(t.params.Content); i += 2 {
		kn, vn := t.params.Content[i], t.params.Content[i+1]
		if kn.Value == key {
			vn = &yaml.Node{Kind: yaml.ScalarNode, Value: value, Line: vn.Line, Column: vn.Column} // tag resolved from the value
			set = true
		}
		out.params.Content = append(out.params.Content, kn, vn)
	}
	if !set {
		out.params.Content = append(out.params.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key, Line: t.line},
			&yaml.Node{Kind: yaml.ScalarNode, Value: value, Line: t.line})
	}
	return out
}

// Decode decodes the type-specific keys into v, a pointer to a struct with
// yaml tags, as strictly as the rest of the file: keys v has no field for,
// values of the wrong type and invalid values are errors naming the key
// path (secondary_tiers[1].locality). Fields whose key is absent keep the
// value v had, so callers set defaults before decoding.
func (t TierSpec) Decode(v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("config: TierSpec.Decode needs a non-nil pointer to a struct, got %T", v)
	}
	n := &t.params
	if n.Kind == 0 {
		n = &yaml.Node{Kind: yaml.MappingNode, Line: t.line}
	}
	d := &decoder{file: t.file}
	d.decodeStruct(n, t.path, rv.Elem(), []string{"name", "type"})
	return d.err()
}

// Errorf returns an *Error about the entry's type-specific key (or about
// the entry itself when key is ""), for checks done after Decode, such as
// a value out of range.
func (t TierSpec) Errorf(key, format string, args ...any) error {
	line, path := t.line, t.path
	if key != "" {
		path = joinPath(path, key)
		if vn := t.value(key); vn != nil {
			line = vn.Line
		}
	}
	return &Error{File: t.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
}

func (t *TierSpec) decodeNode(d *decoder, n *yaml.Node, path string) {
	*t = TierSpec{file: d.file, path: path}
	if n != nil {
		t.line = n.Line
	}
	if isNull(n) || n.Kind != yaml.MappingNode {
		got := "nothing"
		if !isNull(n) {
			got = confvalue.Describe(n)
		}
		d.errorf(n, path, "want a tier such as {name: cache, type: memory}, got %s", got)
		return
	}
	t.params = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column}
	seen := make(map[string]int, len(n.Content)/2)
	hasType := false
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := resolve(n.Content[i]), resolve(n.Content[i+1])
		if kn.Kind != yaml.ScalarNode {
			d.errorf(kn, path, "keys must be strings, got %s", confvalue.Describe(kn))
			continue
		}
		p := joinPath(path, kn.Value)
		if first, dup := seen[kn.Value]; dup {
			d.errorf(kn, p, "duplicate key (first set on line %d)", first)
			continue
		}
		seen[kn.Value] = kn.Line
		switch kn.Value {
		case "name":
			if vn.Kind != yaml.ScalarNode || isNull(vn) {
				d.errorf(vn, p, "want a string, got %s", confvalue.Describe(vn))
				continue
			}
			t.Name, t.nameLine = vn.Value, vn.Line
		case "type":
			hasType = true
			if vn.Kind != yaml.ScalarNode || isNull(vn) || vn.Value == "" {
				d.errorf(vn, p, "want a tier type such as memory, got %s", confvalue.Describe(vn))
				continue
			}
			t.Type = strings.ToLower(vn.Value)
		default:
			t.params.Content = append(t.params.Content, kn, vn)
		}
	}
	if !hasType {
		d.errorf(n, joinPath(path, "type"), "missing (every secondary tier needs a type, such as memory)")
	}
}
