package fs

import "unsafe"

// align is the O_DIRECT alignment of offsets, lengths and buffer
// addresses. 4096 satisfies both 512-byte and 4 KiB logical sectors.
const align = 4096

// roundUp rounds n up to a multiple of align.
func roundUp(n int64) int64 { return (n + align - 1) &^ (align - 1) }

// isAligned reports whether b starts on an align boundary and its length
// is a multiple of align (what O_DIRECT needs from an in-place buffer).
func isAligned(b []byte) bool {
	return len(b)%align == 0 && len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%align == 0
}

// alignedBuf returns n bytes starting at an align boundary, carved out
// of a slightly larger allocation (the slice keeps the allocation alive).
func alignedBuf(n int) []byte {
	raw := make([]byte, n+align)
	off := int((align - uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%align) % align)
	return raw[off : off+n : off+n]
}
