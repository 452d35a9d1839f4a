package redis

import (
	"context"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis's package-wide logger: tests stop servers on
// purpose, and every refused dial would print a line.
func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}
