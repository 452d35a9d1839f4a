// Package config reads kvtier's YAML configuration: the namespace, the CPU
// primary tier, the ordered list of secondary tiers, the server default
// tier filters and the request validation mode. It is the daemon's config
// file; `kvtier explain` reads the same file.
//
// Decoding is strict. Unknown keys, duplicate keys and values of the wrong
// type or outside their set are errors, and every error names the key path
// it is about, for example
//
//	secondary_tiers[1].locality: invalid value "moon" (want local or remote)
//
// yaml.v3's KnownFields(true) gives the same strictness but reports Go type
// names instead of key paths, so the package parses the document into a
// yaml.Node tree and decodes that tree itself, field by field, tracking
// the path. Scalars are still converted by yaml.v3.
//
// The package checks what it can know: syntax, the generic shape of each
// secondary tier entry ({name, type, ...}) and the default filters. The
// type-specific keys of a tier are kept undecoded in its TierSpec; the
// package that builds tiers (tierset) decodes them with TierSpec.Decode,
// which applies the same strictness.
package config
