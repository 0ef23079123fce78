//go:build !unix

// Command sql-fencing needs a Unix system: it freezes worker A with SIGSTOP.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "sql-fencing: needs a Unix system (it freezes worker A with SIGSTOP)")
	os.Exit(1)
}
