package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

// Filter is a server default tier filter (default_load_tiers or
// default_store_tiers): the same list of {medium, locality} matchers a
// request sends in kv_load_tiers, parsed by offload.ParseTierFilter.
// Everything a request would only be warned about is an error here, and so
// is an unknown key inside a matcher (a request ignores it; in a config a
// typo such as "medum" would silently turn the matcher into match-all).
type Filter struct {
	f *offload.TierFilter
}

// TierFilter returns the parsed filter, or nil when the key is absent or
// null: requests that omit the field then get All, as upstream.
func (f Filter) TierFilter() *offload.TierFilter { return f.f }

// IsSet reports whether the config sets this default.
func (f Filter) IsSet() bool { return f.f != nil }

// NewFilter wraps a parsed filter, for configs built in code.
func NewFilter(tf *offload.TierFilter) Filter { return Filter{f: tf} }

func (f *Filter) decodeNode(d *decoder, n *yaml.Node, path string) {
	f.f = nil
	if isNull(n) {
		return
	}
	var raw any
	if err := n.Decode(&raw); err != nil {
		d.errorf(n, path, "%v", err)
		return
	}
	before := len(d.errs)
	tf, warns := offload.ParseTierFilter(path, raw)
	for _, w := range warns {
		d.filterError(n, path, w)
	}
	if n.Kind == yaml.SequenceNode {
		for i, e := range n.Content {
			e = resolve(e)
			if e.Kind != yaml.MappingNode {
				continue
			}
			for j := 0; j+1 < len(e.Content); j += 2 {
				if k := e.Content[j].Value; k != "medium" && k != "locality" {
					d.errorf(e.Content[j], fmt.Sprintf("%s[%d].%s", path, i, k), "unknown key (want medium or locality)")
				}
			}
		}
	}
	if len(d.errs) == before {
		f.f = tf
	}
}

// filterError turns a parse warning about the filter at n into an error
// at the entry or key it is about.
func (d *decoder) filterError(n *yaml.Node, path string, w offload.Warning) {
	var entry *yaml.Node
	if n.Kind == yaml.SequenceNode && w.Entry >= 0 && w.Entry < len(n.Content) {
		entry = resolve(n.Content[w.Entry])
	}
	at := func(key string) (*yaml.Node, string) {
		p := fmt.Sprintf("%s[%d]", path, w.Entry)
		if entry == nil {
			return n, p
		}
		for j := 0; key != "" && j+1 < len(entry.Content); j += 2 {
			if entry.Content[j].Value == key {
				return entry.Content[j+1], p + "." + key
			}
		}
		return entry, p
	}
	switch w.Reason {
	case offload.ReasonNotList:
		d.errorf(n, path, "want a list of matchers such as [{medium: storage}], got %s", confvalue.Describe(n))
	case offload.ReasonEntryNotObject:
		en, p := at("")
		d.errorf(en, p, "want a matcher such as {medium: storage, locality: local}, got %s", w.Value)
	case offload.ReasonUnknownMedium:
		en, p := at("medium")
		d.errorf(en, p, "invalid value %s (want cpu or storage)", w.Value)
	case offload.ReasonUnknownLocality:
		en, p := at("locality")
		d.errorf(en, p, "invalid value %s (want local or remote)", w.Value)
	default:
		d.errorf(n, path, "%s", w.Message)
	}
}
