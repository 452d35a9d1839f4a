package explain

import (
	"fmt"

	"github.com/kvtier/kvtier/offload"
)

// Declaration is what a configured secondary tier declares about itself:
// its name, its type and the medium and locality the tiering manager
// filters it by (unspecified = dynamic on that axis).
type Declaration struct {
	Name     string
	Type     string
	Medium   offload.Medium
	Locality offload.Locality
}

// DeclarationOf returns the declaration of a built tier.
func DeclarationOf(t offload.SecondaryTier) Declaration {
	return Declaration{Name: t.Name(), Type: t.Type(), Medium: t.Medium(), Locality: t.Locality()}
}

// MediumString returns the medium's wire name, or "dynamic".
func (d Declaration) MediumString() string {
	if d.Medium == offload.MediumUnspecified {
		return "dynamic"
	}
	return d.Medium.String()
}

// LocalityString returns the locality's wire name, or "dynamic".
func (d Declaration) LocalityString() string {
	if d.Locality == offload.LocalityUnspecified {
		return "dynamic"
	}
	return d.Locality.String()
}

// String renders d as "name (type, MEDIUM/LOCALITY)".
func (d Declaration) String() string {
	return fmt.Sprintf("%s (%s, %s/%s)", d.Name, d.Type, d.MediumString(), d.LocalityString())
}

// Details are what some tiers declare beyond their medium and locality.
type Details struct {
	// Parts are the sources a dynamic tier chooses between per request,
	// each with the medium and locality it filters them by (a peer tier's
	// peers).
	Parts []Declaration
	// ReadOnly: the tier takes no stores (offload.ReadOnly).
	ReadOnly bool
}

// Composite is a tier made of parts that the filter judges one by one (a
// peer tier's peer daemons): it declares them.
type Composite interface {
	Parts() []Declaration
}

// DetailsOf returns the Details of a built tier: whether it is read-only
// (offload.ReadOnly), and its parts (Composite).
func DetailsOf(t offload.SecondaryTier) Details {
	var d Details
	if ro, ok := t.(offload.ReadOnly); ok {
		d.ReadOnly = ro.ReadOnly()
	}
	if c, ok := t.(Composite); ok {
		d.Parts = c.Parts()
	}
	return d
}
