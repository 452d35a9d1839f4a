// Package vfs is the filesystem seam of kvtier's storage tiers, in the
// spirit of pebble's vfs: the tiers do all their file I/O through the FS
// and File interfaces, so production runs on the operating system (OS)
// while tests wrap it with an Injector that makes chosen operations fail
// with ENOSPC or EIO, transfer only part of their bytes, or "crash" the
// process (the operation does not happen and every later one fails, which
// leaves on disk exactly what a real crash at that point would).
package vfs
