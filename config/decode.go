package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"go.yaml.in/yaml/v3"
)

// Error is one problem in a config file. Path is the key path it is about
// (for example "secondary_tiers[1].locality"); Line is the 1-based line
// of the offending node, 0 when the problem is not tied to one node.
type Error struct {
	File string
	Line int
	Path string
	Msg  string
}

// Error renders e as "file:line: path: msg"; the file and line prefix is
// left out when the config did not come from a file.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// maxErrors bounds how many problems one decode reports: enough to fix a
// file in one go, not a wall of text for a file that is not a config.
const maxErrors = 20

// maxValues bounds the values one decode builds. YAML aliases let a small
// document name a huge value (an alias of an n-item list used n times is
// n² items); yaml.v3 bounds that when it decodes, but this package walks
// the node tree itself. A real config has a few hundred values.
const maxValues = 1 << 18

// decoder decodes a yaml.Node tree into Go values strictly, collecting
// every problem as an *Error that names its key path.
type decoder struct {
	file   string
	errs   []error
	values int // values decoded so far, aliases counted at every use
}

// errorf records a problem at node n (nil when no node is to blame).
func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errorAt(line, path, format, args...)
}

func (d *decoder) errorAt(line int, path, format string, args ...any) {
	if len(d.errs) >= maxErrors {
		return
	}
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) err() error { return errors.Join(d.errs...) }

// nodeDecoder is implemented by config types that decode themselves and
// need the key path for their errors (TierSpec, Filter). It is called for
// null nodes too.
type nodeDecoder interface {
	decodeNode(d *decoder, n *yaml.Node, path string)
}

var (
	nodeType     = reflect.TypeFor[yaml.Node]()
	durationType = reflect.TypeFor[time.Duration]()
)

// resolve follows documents and aliases to the node holding the value.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil {
		switch {
		case n.Kind == yaml.DocumentNode && len(n.Content) == 1:
			n = n.Content[0]
		case n.Kind == yaml.AliasNode && n.Alias != nil:
			n = n.Alias
		default:
			return n
		}
	}
	return n
}

// isNull reports an absent value: an empty document, "~", "null" or an
// empty value after a key. Null keeps the default.
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decode stores n into v (which must be settable), reporting problems
// under path. Null leaves v unchanged, so defaults set beforehand stay.
func (d *decoder) decode(n *yaml.Node, path string, v reflect.Value) {
	if d.values++; d.values > maxValues {
		if d.values == maxValues+1 {
			d.errorf(n, path, "the document expands to more than %d values (through YAML aliases?)", maxValues)
		}
		return
	}
	n = resolve(n)
	if v.CanAddr() {
		if nd, ok := v.Addr().Interface().(nodeDecoder); ok {
			nd.decodeNode(d, n, path)
			return
		}
	}
	if isNull(n) {
		return
	}
	if v.Type() == nodeType {
		v.Set(reflect.ValueOf(*n))
		return
	}
	if v.CanAddr() {
		if _, ok := v.Addr().Interface().(yaml.Unmarshaler); ok {
			if err := n.Decode(v.Addr().Interface()); err != nil {
				d.errorf(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
			}
			return
		}
	}
	switch v.Kind() {
	case reflect.Struct:
		d.decodeStruct(n, path, v, nil)
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, path, v.Elem())
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, path, "want a list, got %s", confvalue.Describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			d.decode(c, fmt.Sprintf("%s[%d]", path, i), s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		d.decodeMap(n, path, v)
	case reflect.Interface:
		// Free-form values (map[string]any and the like) take any shape.
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.errorf(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
	default:
		if n.Kind != yaml.ScalarNode {
			d.errorf(n, path, "want %s, got %s", describeType(v.Type()), confvalue.Describe(n))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.errorf(n, path, "invalid value %q (want %s)", n.Value, describeType(v.Type()))
		}
	}
}

// decodeStruct decodes a mapping into the yaml-tagged fields of struct v.
// extra names keys that the caller handles itself (accepted, skipped and
// listed in the unknown-key message).
func (d *decoder) decodeStruct(n *yaml.Node, path string, v reflect.Value, extra []string) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping of keys, got %s", confvalue.Describe(n))
		return
	}
	fields, names := structFields(v.Type())
	skip := make(map[string]bool, len(extra))
	for _, k := range extra {
		skip[k] = true
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := resolve(n.Content[i]), n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			d.errorf(kn, path, "keys must be strings, got %s", confvalue.Describe(kn))
			continue
		}
		key := kn.Value
		p := joinPath(path, key)
		if first, dup := seen[key]; dup {
			d.errorf(kn, p, "duplicate key (first set on line %d)", first)
			continue
		}
		seen[key] = kn.Line
		if skip[key] {
			continue
		}
		idx, ok := fields[key]
		if !ok {
			d.errorf(kn, p, "unknown key (want one of: %s)", strings.Join(slices.Concat(extra, names), ", "))
			continue
		}
		d.decode(vn, p, v.FieldByIndex(idx))
	}
}

func (d *decoder) decodeMap(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping of keys, got %s", confvalue.Describe(n))
		return
	}
	if v.Type().Key().Kind() != reflect.String {
		d.errorf(n, path, "internal: map key type %s is not supported", v.Type().Key())
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := resolve(n.Content[i]), n.Content[i+1]
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
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(vn, p, elem)
		v.SetMapIndex(reflect.ValueOf(kn.Value).Convert(v.Type().Key()), elem)
	}
}

// structFields maps the yaml key of every exported field of t (following
// ",inline" structs) to its index path; names lists the keys in field order.
func structFields(t reflect.Type) (fields map[string][]int, names []string) {
	fields = make(map[string][]int)
	var walk func(t reflect.Type, prefix []int)
	walk = func(t reflect.Type, prefix []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("yaml")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" {
				continue
			}
			idx := append(append([]int(nil), prefix...), i)
			if strings.Contains(opts, "inline") && f.Type.Kind() == reflect.Struct {
				walk(f.Type, idx)
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			fields[name] = idx
			names = append(names, name)
		}
	}
	walk(t, nil)
	return fields, names
}

// describeType says in words what a value of type t looks like.
func describeType(t reflect.Type) string {
	if t == durationType {
		return "a duration such as 250ms or 2s"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return t.String()
}
