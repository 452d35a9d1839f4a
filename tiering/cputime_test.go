package tiering

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU measures the CPU time of the benchmark's own thread. On a
// shared machine wall-clock figures include time spent descheduled; the
// thread's CPU time does not (it excludes GC work on other threads).
type threadCPU struct{ start time.Duration }

func startThreadCPU(b *testing.B) *threadCPU {
	runtime.LockOSThread()
	b.Cleanup(runtime.UnlockOSThread)
	return &threadCPU{start: threadTime()}
}

func threadTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds the thread CPU time per unit as a metric.
func (c *threadCPU) report(b *testing.B, units int, name string) {
	b.ReportMetric(float64((threadTime()-c.start).Nanoseconds())/float64(units), name)
}
