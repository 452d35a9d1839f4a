package blockhash

import (
	"encoding/binary"
	"math/big"
	"unicode/utf8"
)

// pickle returns the bytes CPython's pickle.dumps(v, protocol=5) writes
// for the values vLLM hashes (None, bytes, str, int, tuples of them): the
// C pickler's opcodes, its memo (every bytes, str and non-empty tuple is
// memoized; a str CPython keeps as a singleton — empty, or one character
// below U+0100 — is one object, so its second occurrence is a memo
// reference) and its framing (a frame is closed once it reaches 64 KiB at
// an object boundary; one under 4 bytes loses its header).
func pickle(v any) []byte {
	p := pickler{out: []byte{opProto, 5}, frameStart: -1}
	p.save(v)
	p.write(opStop)
	p.commitFrame()
	return p.out
}

// Pickle opcodes.
const (
	opProto         = 0x80
	opFrame         = 0x95
	opStop          = '.'
	opNone          = 'N'
	opMark          = '('
	opTuple         = 't'
	opEmptyTuple    = ')'
	opTuple1        = 0x85
	opBinInt1       = 'K'
	opBinInt2       = 'M'
	opBinInt        = 'J'
	opLong1         = 0x8a
	opShortBinBytes = 'C'
	opBinBytes      = 'B'
	opShortBinUni   = 0x8c
	opBinUnicode    = 'X'
	opMemoize       = 0x94
	opBinGet        = 'h'
	opLongBinGet    = 'j'
)

const (
	frameHeader = 9
	frameMin    = 4
	frameTarget = 64 << 10
)

type pickler struct {
	out        []byte
	frameStart int
	memo       int            // next memo index
	singletons map[string]int // memo index of each singleton str written
}

// write appends b, opening a frame first if none is open.
func (p *pickler) write(b ...byte) {
	if p.frameStart < 0 {
		p.frameStart = len(p.out)
		p.out = append(p.out, make([]byte, frameHeader)...)
	}
	p.out = append(p.out, b...)
}

func (p *pickler) commitFrame() {
	if p.frameStart < 0 {
		return
	}
	n := len(p.out) - p.frameStart - frameHeader
	if n >= frameMin {
		p.out[p.frameStart] = opFrame
		binary.LittleEndian.PutUint64(p.out[p.frameStart+1:], uint64(n))
	} else {
		copy(p.out[p.frameStart:], p.out[p.frameStart+frameHeader:])
		p.out = p.out[:len(p.out)-frameHeader]
	}
	p.frameStart = -1
}

// boundary is the pickler's check after each object: a frame that has
// reached its target size is closed.
func (p *pickler) boundary() {
	if p.frameStart >= 0 && len(p.out)-p.frameStart-frameHeader >= frameTarget {
		p.commitFrame()
	}
}

func (p *pickler) memoize() {
	p.write(opMemoize)
	p.memo++
}

func (p *pickler) save(v any) {
	switch v := v.(type) {
	case nil:
		p.write(opNone)
	case int64:
		p.saveInt(v)
	case []byte:
		p.saveBytes(v)
	case string:
		p.saveStr(v)
	case ints:
		// The block's tokens, without boxing each into an interface.
		p.saveTuple(len(v), func(i int) {
			p.saveInt(v[i])
			p.boundary()
		})
	case tuple:
		p.saveTuple(len(v), func(i int) { p.save(v[i]) })
	default:
		panic("blockhash: cannot pickle a value of this type")
	}
	p.boundary()
}

func (p *pickler) saveInt(x int64) {
	switch {
	case x >= 0 && x < 1<<8:
		p.write(opBinInt1, byte(x))
	case x >= 0 && x < 1<<16:
		p.write(opBinInt2, byte(x), byte(x>>8))
	case x >= -1<<31 && x < 1<<31:
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(int32(x)))
		p.write(append([]byte{opBinInt}, b[:]...)...)
	default:
		b := encodeLong(x)
		p.write(append([]byte{opLong1, byte(len(b))}, b...)...)
	}
}

// encodeLong is pickle's encode_long: x in two's complement, little
// endian, in the fewest bytes that keep its sign.
func encodeLong(x int64) []byte {
	n := (big.NewInt(x).BitLen() >> 3) + 1
	b := make([]byte, n)
	for i := range b {
		if i < 8 {
			b[i] = byte(uint64(x) >> (8 * i))
		} else {
			b[i] = byte(x >> 63) // the sign, past 8 bytes
		}
	}
	if x < 0 && n > 1 && b[n-1] == 0xff && b[n-2]&0x80 != 0 {
		b = b[:n-1]
	}
	return b
}

func (p *pickler) saveBytes(b []byte) {
	if len(b) < 256 {
		p.write(opShortBinBytes, byte(len(b)))
	} else {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
		p.write(append([]byte{opBinBytes}, n[:]...)...)
	}
	p.write(b...)
	p.memoize()
}

func (p *pickler) saveStr(s string) {
	single := s == "" || (utf8.RuneCountInString(s) == 1 && []rune(s)[0] < 0x100)
	if single {
		if i, ok := p.singletons[s]; ok {
			if i < 256 {
				p.write(opBinGet, byte(i))
			} else {
				var n [4]byte
				binary.LittleEndian.PutUint32(n[:], uint32(i))
				p.write(append([]byte{opLongBinGet}, n[:]...)...)
			}
			return
		}
		if p.singletons == nil {
			p.singletons = map[string]int{}
		}
		p.singletons[s] = p.memo
	}
	if len(s) < 256 {
		p.write(opShortBinUni, byte(len(s)))
	} else {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
		p.write(append([]byte{opBinUnicode}, n[:]...)...)
	}
	p.write([]byte(s)...)
	p.memoize()
}

// saveTuple writes a tuple of n items, item(i) writing each one.
func (p *pickler) saveTuple(n int, item func(i int)) {
	if n == 0 {
		p.write(opEmptyTuple)
		return
	}
	if n > 3 {
		p.write(opMark)
	}
	for i := range n {
		item(i)
	}
	if n <= 3 {
		p.write(opTuple1 + byte(n-1))
	} else {
		p.write(opTuple)
	}
	p.memoize()
}
