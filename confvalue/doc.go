// Package confvalue holds the value types configuration files are
// written in — sizes with units (ByteSize: "2MiB", "1.5 GiB") and
// durations ("250ms") — with their YAML decoding and its errors, so that
// the config package and every tier's own config decode them alike
// without a tier depending on the daemon's configuration.
package confvalue
