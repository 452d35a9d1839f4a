// Package vfs is the filesystem seam of kvtier's storage tiers, in the
// spirit of pebble's vfs: the tiers do all their file I/O through the FS
// and File interfaces, so production runs on the operating system (OS)
// while tests wrap it with the fault injection of package vfs/vfstest.
// Only the seam ships in the daemon.
package vfs
