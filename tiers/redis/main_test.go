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
// closed tiers leave no goroutine behind.
func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}
