//go:build !linux

package fs

// oDirect is 0 where O_DIRECT does not exist; the probe then reports
// that direct I/O is unavailable.
const oDirect = 0
