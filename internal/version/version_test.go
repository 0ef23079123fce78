package version

import (
	"encoding/json"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/lockd/lockd/api/openapi"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := func(mod, rev, modified string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/lockd/lockd", Version: mod}}
		if rev != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs", Value: "git"},
				debug.BuildSetting{Key: "vcs.revision", Value: rev})
		}
		if modified != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return bi
	}
	const rev = "c2dad539e71bee9b09d8018529a2a42cd90f5963"
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "dev"},
		{"no vcs, devel", vcs("(devel)", "", ""), "dev"},
		{"no vcs, empty", vcs("", "", ""), "dev"},
		{"module at a tag", vcs("v1.2.0", "", ""), "v1.2.0"},
		{"module at a commit", vcs("v0.0.0-20261201163752-c2dad539e71b", "", ""), "v0.0.0-20261201163752-c2dad539e71b"},
		{"checkout", vcs("v0.0.0-20261201163752-c2dad539e71b", rev, "false"), "dev+c2dad539e71b"},
		{"checkout, modified", vcs("v0.0.0-20261201163752-c2dad539e71b+dirty", rev, "true"), "dev+c2dad539e71b+dirty"},
		{"checkout, older go", vcs("(devel)", rev, "false"), "dev+c2dad539e71b"},
		{"checkout after a tag", vcs("v1.2.1-0.20261201163752-c2dad539e71b", rev, "false"), "dev+c2dad539e71b"},
		{"checkout of a tag", vcs("v1.2.0", rev, "false"), "v1.2.0"},
		{"checkout of a release candidate", vcs("v1.2.0-rc.1", rev, "false"), "v1.2.0-rc.1"},
		{"checkout of a tag, modified", vcs("v1.2.0+dirty", rev, "true"), "dev+c2dad539e71b+dirty"},
		{"short revision", vcs("(devel)", "abc123", ""), "dev+abc123"},
	} {
		if got := FromBuildInfo(c.bi); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestTestBinaryVersion: a test binary carries no version control
// information, so String falls back to "dev" (and caches it).
func TestTestBinaryVersion(t *testing.T) {
	if got := String(); got != "dev" && !strings.HasPrefix(got, "v") {
		t.Fatalf("String() = %q", got)
	}
	if String() != String() {
		t.Fatal("String is not stable")
	}
}

// TestOpenAPIVersionIsTheRelease: the OpenAPI document every member serves
// names the release this tree is.
func TestOpenAPIVersionIsTheRelease(t *testing.T) {
	var doc struct {
		Info struct {
			Version string `json:"version"`
		} `json:"info"`
	}
	if err := json.Unmarshal(openapi.JSON(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Info.Version != Release {
		t.Fatalf("api/openapi/openapi.json info.version is %q, internal/version.Release is %q: change both together", doc.Info.Version, Release)
	}
}

// TestReleaseTagMatches: a commit tagged as a release (v*) is that
// release: its tag is "v" + Release. Skipped outside a git checkout.
func TestReleaseTagMatches(t *testing.T) {
	out, err := exec.Command("git", "tag", "--points-at", "HEAD", "--list", "v[0-9]*").Output()
	if err != nil {
		t.Skipf("not a git checkout here: %v", err)
	}
	for _, tag := range strings.Fields(string(out)) {
		if tag != "v"+Release {
			t.Errorf("HEAD is tagged %s but internal/version.Release is %q", tag, Release)
		}
	}
}
