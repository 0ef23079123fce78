//go:build !unix

// Command fencing-demo needs a Unix system: it freezes a process with SIGSTOP.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "fencing-demo: needs a Unix system (it freezes client A with SIGSTOP)")
	os.Exit(1)
}
