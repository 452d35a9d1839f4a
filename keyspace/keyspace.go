package keyspace

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/kvtier/kvtier/offload"
)

// Marker is the first byte of every tagged key.
const Marker = 0xfe

// TagLen is the length of a space's tag: the marker and the 8-byte ID.
const TagLen = 9

// Space is one key space. The zero Space is the untagged space of the
// daemon's own keys: its Key and Strip change nothing.
type Space struct {
	name string
	id   uint64
	tag  string
}

// New returns the space called name. The name must not be empty.
func New(name string) (Space, error) {
	if name == "" {
		return Space{}, fmt.Errorf("keyspace: empty space name")
	}
	sum := sha256.Sum256([]byte("kvtier key space\x00" + name))
	id := binary.BigEndian.Uint64(sum[:8])
	if id == 0 {
		id = 1 // 0 means untagged everywhere
	}
	var tag [TagLen]byte
	tag[0] = Marker
	binary.BigEndian.PutUint64(tag[1:], id)
	return Space{name: name, id: id, tag: string(tag[:])}, nil
}

// Name returns the space's name; "" for the untagged space.
func (s Space) Name() string { return s.name }

// ID returns the space's identity, 0 for the untagged space.
func (s Space) ID() uint64 { return s.id }

// Tagged reports whether s tags keys (it is not the untagged space).
func (s Space) Tagged() bool { return s.id != 0 }

// Key returns b's key in s: one allocation, as converting b to a Key
// would be. The result may be longer than offload.MaxKeyLen; callers
// validate it.
func (s Space) Key(b []byte) offload.Key {
	if s.id == 0 {
		return offload.Key(b)
	}
	k := make([]byte, 0, TagLen+len(b))
	k = append(k, s.tag...)
	k = append(k, b...)
	return offload.Key(k)
}

// Strip returns k without s's tag, and whether k is in s. The untagged
// space is the admin's, which sees every key as it is.
func (s Space) Strip(k offload.Key) (offload.Key, bool) {
	if s.id == 0 {
		return k, true
	}
	if len(k) < TagLen || string(k[:TagLen]) != s.tag {
		return k, false
	}
	return k[TagLen:], true
}

// IDOf returns the ID of k's space, and false for an untagged key. An
// engine's raw key may happen to start like a tag, so an ID means
// something only when it is one of the configured spaces'.
func IDOf(k offload.Key) (uint64, bool) {
	if len(k) <= TagLen || k[0] != Marker {
		return 0, false
	}
	id := uint64(k[1])<<56 | uint64(k[2])<<48 | uint64(k[3])<<40 | uint64(k[4])<<32 |
		uint64(k[5])<<24 | uint64(k[6])<<16 | uint64(k[7])<<8 | uint64(k[8])
	if id == 0 {
		return 0, false
	}
	return id, true
}

// Tenant returns the key space of the daemon's tenant called name, which
// holds the tenant's private blocks in every namespace and tier.
func Tenant(name string) (Space, error) { return New("tenant/" + name) }

// Shared returns the key space of the shared space called name.
func Shared(name string) (Space, error) { return New("shared/" + name) }
