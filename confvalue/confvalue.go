package confvalue

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
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
		return fmt.Errorf("want a size, got %s (%s)", Describe(n), sizeWant)
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

// Duration is a non-negative time.Duration written as a Go duration
// string such as "250ms" or "2s" (case-insensitive). A bare number is
// refused: it would be ambiguous between seconds and nanoseconds.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	const want = "want a duration such as 250ms or 2s"
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("invalid value %s (%s)", Describe(n), want)
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
