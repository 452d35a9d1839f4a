package config

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

// decodeEnum accepts one of want (lower-case), case-insensitively, and
// returns it in lower case.
func decodeEnum(n *yaml.Node, want ...string) (string, error) {
	if n.Kind == yaml.ScalarNode {
		v := strings.ToLower(n.Value)
		for _, w := range want {
			if v == w {
				return v, nil
			}
		}
	}
	got := confvalue.Describe(n)
	if n.Kind == yaml.ScalarNode {
		got = strconv.Quote(n.Value)
	}
	return "", fmt.Errorf("invalid value %s (want %s)", got, orList(want))
}

// orList renders ["a","b","c"] as "a, b or c".
func orList(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Medium is a tier's declared medium in the config: cpu or storage,
// case-insensitive. Absent or null leaves it unspecified: the tier is
// dynamic on this axis and applies each request's filter itself.
type Medium offload.Medium

// UnmarshalYAML implements yaml.Unmarshaler.
func (m *Medium) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, "cpu", "storage")
	if err != nil {
		return err
	}
	v, _ := offload.ParseMedium(s)
	*m = Medium(v)
	return nil
}

// Value returns the offload medium (MediumUnspecified when absent).
func (m Medium) Value() offload.Medium { return offload.Medium(m) }

// Locality is a tier's declared locality in the config: local or remote,
// case-insensitive (confvalue.ParseLocality, which every tier's config
// uses too). Absent or null leaves it unspecified (dynamic). The
// request-side synonym "global" is not accepted here: a config names the
// placement exactly (docs/semantics.md §8.5).
type Locality offload.Locality

// UnmarshalYAML implements yaml.Unmarshaler.
func (l *Locality) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, "local", "remote")
	if err != nil {
		return err
	}
	v, err := confvalue.ParseLocality(s)
	if err != nil {
		return err
	}
	*l = Locality(v)
	return nil
}

// Value returns the offload locality (LocalityUnspecified when absent).
func (l Locality) Value() offload.Locality { return offload.Locality(l) }

// Policy is the primary tier's eviction policy: "lru" or "arc".
type Policy string

// Eviction policies.
const (
	PolicyLRU Policy = "lru"
	PolicyARC Policy = "arc"
)

// UnmarshalYAML implements yaml.Unmarshaler.
func (p *Policy) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, string(PolicyLRU), string(PolicyARC))
	if err != nil {
		return err
	}
	*p = Policy(s)
	return nil
}

// ArenaKind is the backing memory of the primary tier's slot arena.
type ArenaKind string

// Arena kinds.
const (
	// ArenaAnonymous is private anonymous memory.
	ArenaAnonymous ArenaKind = "anonymous"
	// ArenaFile is a shared file (for example under /dev/shm) that an
	// engine on the same host maps.
	ArenaFile ArenaKind = "file"
	// ArenaMemfd is a memfd the daemon passes to engines over its socket.
	ArenaMemfd ArenaKind = "memfd"
)

// UnmarshalYAML implements yaml.Unmarshaler.
func (k *ArenaKind) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, string(ArenaAnonymous), string(ArenaFile), string(ArenaMemfd))
	if err != nil {
		return err
	}
	*k = ArenaKind(s)
	return nil
}

// Validation is the request validation mode: lenient (the default,
// upstream behaviour) or strict.
type Validation offload.ValidationMode

// UnmarshalYAML implements yaml.Unmarshaler.
func (v *Validation) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, "lenient", "strict")
	if err != nil {
		return err
	}
	m, err := offload.ParseValidationMode(s)
	*v = Validation(m)
	return err
}

// Mode returns the offload validation mode.
func (v Validation) Mode() offload.ValidationMode { return offload.ValidationMode(v) }

// String returns "lenient" or "strict".
func (v Validation) String() string { return v.Mode().String() }
