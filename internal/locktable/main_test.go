package locktable_test

import (
	"flag"
	"os"
	"testing"
)

// TestMain caps rapid's shrinking (30 s by default) so that a failing
// property still reports within the package's time budget. An explicit
// -rapid.shrinktime on the command line wins.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.shrinktime" })
	if !set {
		if err := flag.Set("rapid.shrinktime", "5s"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
