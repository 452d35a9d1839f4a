package redis

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis's package-wide logger (tests stop servers on
// purpose, and every refused dial would print a line) and checks that
// closed tiers leave no goroutine behind. go-redis's re-dial loop for a
// node that refused a connection (a cluster master a test killed) ends
// only at its next one-second tick after the pool closes; it is the
// library's, not a leak of the tier's.
func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
