package confvalue

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Describe names what a YAML node holds, for errors: "a mapping", "a
// list", the quoted scalar, or "nothing".
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}
