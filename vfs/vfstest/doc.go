// Package vfstest injects filesystem faults for tests, as pebble's
// vfs/errorfs does: an Injector (a vfs.FS over another) makes chosen
// operations fail with ENOSPC or EIO, transfer only part of their bytes,
// or "crash" the process (the operation does not happen and every later
// one fails, which leaves on disk exactly what a real crash at that point
// would); a PowerCut remembers what was written since the last sync and
// loses it, as a power cut does. The daemon does not link it.
package vfstest
