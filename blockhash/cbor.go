package blockhash

import "encoding/binary"

// appendCBOR appends v as cbor2.dumps(v, canonical=True) writes it for
// the values vLLM hashes: a tuple is an array, []byte a byte string, a
// str a text string, an int the shortest head of its major type, None
// the simple value null. (Canonical form only reorders maps and shortens
// floats, which these values have none of.)
func appendCBOR(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, 0xf6)
	case int64:
		if v >= 0 {
			return cborHead(b, 0, uint64(v))
		}
		return cborHead(b, 1, uint64(-1-v))
	case []byte:
		return append(cborHead(b, 2, uint64(len(v))), v...)
	case string:
		return append(cborHead(b, 3, uint64(len(v))), v...)
	case ints:
		b = cborHead(b, 4, uint64(len(v)))
		for _, x := range v {
			b = appendCBOR(b, x)
		}
		return b
	case tuple:
		b = cborHead(b, 4, uint64(len(v)))
		for _, x := range v {
			b = appendCBOR(b, x)
		}
		return b
	}
	panic("blockhash: cannot encode a value of this type")
}

// cborHead appends the head of an item of major type major with argument
// n, in its shortest form.
func cborHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), n)
}
