// Package version names the build every lockd binary reports: --version,
// /api/v1/status and lockctl's endpoint status all read it from here.
//
// The version comes from the build information the Go toolchain embeds
// (runtime/debug.ReadBuildInfo):
//
//   - a build of a tagged module (go install .../cmd/lockd@v1.2.0, or a
//     checkout whose HEAD is exactly the tag, unmodified) reports the tag:
//     "v1.2.0";
//   - a build of a checkout reports "dev+" and the first 12 hex digits of
//     its commit, with "+dirty" when the work tree had changes:
//     "dev+c2dad53ab1f4", "dev+c2dad53ab1f4+dirty";
//   - a module build at a commit (a pseudo-version) reports that
//     pseudo-version, which carries the commit: "v0.0.0-20261101-c2dad53ab1f4";
//   - a build with no version control information (go build -buildvcs=false,
//     a source tarball) reports "dev".
//
// Packagers who build from a tarball can stamp the version instead:
// go build -ldflags "-X github.com/lockd/lockd/internal/version.stamp=v1.2.0".
package version

import (
	"runtime/debug"
	"strings"
	"sync"
)

// Release is the release this source tree is: the OpenAPI document's
// info.version must equal it (a test ties them), and the git tag of the
// release is "v" + Release. Raise it, in the same commit as the OpenAPI
// document's info.version, when the API or the release changes.
const Release = "1.0.0"

// stamp overrides the build information when set with -ldflags -X.
var stamp string

var (
	once   sync.Once
	cached string
)

// String is this binary's version (see the package comment).
func String() string {
	once.Do(func() {
		cached = stamp
		if cached == "" {
			bi, _ := debug.ReadBuildInfo()
			cached = FromBuildInfo(bi)
		}
	})
	return cached
}

// FromBuildInfo derives the version from build information (nil: "dev").
func FromBuildInfo(bi *debug.BuildInfo) string {
	if bi == nil {
		return "dev"
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	mod := bi.Main.Version
	if rev == "" {
		// No checkout: a module build reports its module version, which
		// for a commit is a pseudo-version that names the commit.
		if mod == "" || mod == "(devel)" {
			return "dev"
		}
		return mod
	}
	if !dirty && isRelease(mod) {
		return mod // a clean checkout of a tagged commit
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	v := "dev+" + rev
	if dirty {
		v += "+dirty"
	}
	return v
}

// isRelease reports whether a module version is a tag (vMAJOR.MINOR.PATCH,
// optionally with a pre-release such as -rc.1), not a pseudo-version, a
// development build or a modified tree.
func isRelease(v string) bool {
	if !strings.HasPrefix(v, "v") || strings.Contains(v, "+") {
		return false
	}
	core, pre, _ := strings.Cut(v[1:], "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	// A pseudo-version's pre-release is a 14-digit timestamp and a
	// 12-digit commit: "v0.0.0-20261101120000-c2dad53ab1f4" or
	// "v1.2.1-0.20261101120000-c2dad53ab1f4".
	fields := strings.FieldsFunc(pre, func(r rune) bool { return r == '-' || r == '.' })
	if n := len(fields); n >= 2 && len(fields[n-2]) == 14 && len(fields[n-1]) == 12 {
		return false
	}
	return true
}
