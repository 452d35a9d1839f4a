package config

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/offload"
)

// ByteSize is a size in bytes. In YAML it is an integer (bytes) or a
// string with a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB,
// GB, TB (powers of 1000), case-insensitive, for example "2MiB" or
// "1.5 GiB". Single-letter units (k, M, G) are refused as ambiguous.
type ByteSize int64

// Common sizes.
const (
	KiB ByteSize = 1 << 10
	MiB ByteSize = 1 << 20
	GiB ByteSize = 1 << 30
	TiB ByteSize = 1 << 40
)

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)

const sizeWant = "want a size such as 2MiB, 512KiB or 1073741824"

// ParseByteSize parses s as described at ByteSize.
func ParseByteSize(s string) (ByteSize, error) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("invalid value %q (%s)", s, sizeWant)
	}
	mult, ok := byteUnits[strings.ToLower(m[2])]
	if !ok {
		return 0, fmt.Errorf("invalid value %q: unknown unit %q (%s)", s, m[2], sizeWant)
	}
	// Exact arithmetic: "1.5GiB" is a whole number of bytes, "0.3B" is not.
	r, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("invalid value %q (%s)", s, sizeWant)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("invalid value %q: not a whole number of bytes", s)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("invalid value %q: too large", s)
	}
	return ByteSize(r.Num().Int64()), nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("want a size, got %s (%s)", describeNode(n), sizeWant)
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// String renders b with the largest binary unit that divides it exactly.
func (b ByteSize) String() string {
	for _, u := range []struct {
		size ByteSize
		name string
	}{{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if b != 0 && b%u.size == 0 {
			return strconv.FormatInt(int64(b/u.size), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// Approx renders b for people: with one decimal in the largest binary
// unit not above it ("2.0MiB", "117.3GiB"), exact below 1KiB.
func (b ByteSize) Approx() string {
	for _, u := range []struct {
		size ByteSize
		name string
	}{{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if b >= u.size || -b >= u.size {
			return strconv.FormatFloat(float64(b)/float64(u.size), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// Int reports b as an int, false when it does not fit (32-bit platforms).
func (b ByteSize) Int() (int, bool) {
	if int64(b) > math.MaxInt {
		return 0, false
	}
	return int(b), true
}

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
	got := describeNode(n)
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
// case-insensitive. Absent or null leaves it unspecified (dynamic). The
// request-side synonym "global" is not accepted here: a config names the
// placement exactly (spec §8.5).
type Locality offload.Locality

// UnmarshalYAML implements yaml.Unmarshaler.
func (l *Locality) UnmarshalYAML(n *yaml.Node) error {
	s, err := decodeEnum(n, "local", "remote")
	if err != nil {
		return err
	}
	v, _ := offload.ParseLocality(s)
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

// Duration is a non-negative time.Duration written as a Go duration
// string such as "250ms" or "2s" (case-insensitive). A bare number is
// refused: it would be ambiguous between seconds and nanoseconds.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	const want = "want a duration such as 250ms or 2s"
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("invalid value %s (%s)", describeNode(n), want)
	}
	v, err := time.ParseDuration(strings.ToLower(n.Value))
	if err != nil {
		return fmt.Errorf("invalid value %q (%s)", n.Value, want)
	}
	if v < 0 {
		return fmt.Errorf("invalid value %q (must not be negative)", n.Value)
	}
	*d = Duration(v)
	return nil
}

// Value returns d as a time.Duration.
func (d Duration) Value() time.Duration { return time.Duration(d) }
