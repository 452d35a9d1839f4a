package remote

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that Jobs and Health leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
