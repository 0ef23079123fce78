package fence

import (
	"testing"

	"go.uber.org/goleak"
)

// The concurrency tests and httptest servers start goroutines; none may
// outlive the package's tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
