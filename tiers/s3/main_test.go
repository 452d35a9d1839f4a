package s3

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that closed tiers leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
