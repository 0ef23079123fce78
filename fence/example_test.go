package fence_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/lockd/lockd/fence"
)

// A service adds fencing by wrapping its handler: writes then need a
// Fencing-Token, and a token lower than one already seen for the same path
// is refused with 409 before the handler runs. The path is bound to the lock
// its first write names in Fencing-Lock: a write under another lock gets 403.
func Example() {
	var stored string
	files := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		stored = string(body)
		adm, _ := fence.FromContext(r.Context())
		fmt.Fprintf(w, "stored with token %d\n", adm.Token)
	})

	// For durability across restarts use fence.OpenBoltStore; to accept only
	// tokens signed by lockd add fence.WithVerifyKey(pub); to bind paths to
	// locks before their first write, fence.WithGuards.
	checker := fence.NewChecker(fence.NewMemoryStore())
	handler := fence.Middleware(checker)(files)

	write := func(token, value string) {
		r := httptest.NewRequest(http.MethodPut, "/reports/q3", strings.NewReader(value))
		r.Header.Set(fence.HeaderToken, token)
		r.Header.Set(fence.HeaderLock, "reports")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Print(w.Code, " ", w.Body.String())
	}
	write("34", "from the new holder")  // the newer holder writes first
	write("33", "from a paused holder") // the old holder wakes up: refused
	fmt.Println("stored:", stored)
	// Output:
	// 200 stored with token 34
	// 409 {"error":{"code":"stale_token","message":"fencing token 33 is stale: a write with token 34 was already accepted for this resource (the lock was lost)"},"highest_token":34}
	// stored: from the new holder
}
