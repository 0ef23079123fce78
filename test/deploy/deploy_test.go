// Package deploy checks the container files that no CI step here can build:
// this machine has no container runtime, so the checks read the files for
// the mistakes that broke them before.
package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// finalStage returns the lines of the Dockerfile's last stage.
func finalStage(t *testing.T, dockerfile string) []string {
	t.Helper()
	var stage []string
	for _, l := range strings.Split(dockerfile, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(strings.ToUpper(l), "FROM ") {
			stage = nil
		}
		if l != "" && !strings.HasPrefix(l, "#") {
			stage = append(stage, l)
		}
	}
	return stage
}

// TestImageDataDirBelongsToItsUser: the image runs as a non-root user and
// declares /data a volume; a new named volume is filled from the image's
// /data, ownership included, so /data must exist in the image, owned by
// that user, before VOLUME — or lockd cannot write its data dir there.
func TestImageDataDirBelongsToItsUser(t *testing.T) {
	stage := finalStage(t, read(t, "../../Dockerfile"))
	user, chownData, volume := -1, -1, -1
	var uid string
	for i, l := range stage {
		up := strings.ToUpper(l)
		switch {
		case strings.HasPrefix(up, "USER "):
			user, uid = i, strings.Split(strings.Fields(l)[1], ":")[0]
		case strings.HasPrefix(up, "VOLUME") && strings.Contains(l, "/data"):
			volume = i
		case strings.HasPrefix(up, "COPY ") && strings.HasSuffix(l, " /data"):
			if m := regexp.MustCompile(`--chown=([^: ]+)`).FindStringSubmatch(l); m != nil {
				chownData = i
				if uid != "" && m[1] != uid {
					t.Errorf("/data is chowned to %s, the image runs as %s", m[1], uid)
				}
			}
		}
	}
	if user < 0 || uid == "0" || uid == "root" {
		t.Fatalf("the final stage must run as a non-root USER: %q", stage)
	}
	if volume < 0 || chownData < 0 || chownData > volume {
		t.Fatalf("the final stage must create /data owned by the runtime user (COPY --chown=... /data) before VOLUME /data: %q", stage)
	}
	// The chown names the same user as USER, whichever came first.
	for _, l := range stage {
		if strings.HasPrefix(strings.ToUpper(l), "COPY ") && strings.HasSuffix(l, " /data") && !strings.Contains(l, "--chown="+uid) {
			t.Errorf("%q does not chown /data to the USER %s", l, uid)
		}
	}
}

// TestComposeAdvertisesPublishedPorts: each member's HTTP advertise URL is
// the host port it publishes, so a follower's 307 points somewhere the host
// can reach and `curl -L` from the host works whichever member leads.
func TestComposeAdvertisesPublishedPorts(t *testing.T) {
	compose := read(t, "../../docker-compose.yml")
	services := regexp.MustCompile(`(?m)^  (lockd\d):\n((?:    .*\n|\n)*)`).FindAllStringSubmatch(compose, -1)
	if len(services) < 3 {
		t.Fatalf("found %d lockd services", len(services))
	}
	for _, s := range services {
		name, body := s[1], s[2]
		port := regexp.MustCompile(`ports: \["(\d+):7070"\]`).FindStringSubmatch(body)
		adv := regexp.MustCompile(`LOCKD_HTTP_ADVERTISE: (\S+)`).FindStringSubmatch(body)
		if port == nil || adv == nil {
			t.Fatalf("%s: no published HTTP port or no HTTP advertise URL:\n%s", name, body)
		}
		if want := "http://localhost:" + port[1]; adv[1] != want {
			t.Errorf("%s advertises %s but publishes %s: a redirect to it fails from the host; want %s", name, adv[1], port[1], want)
		}
	}
}
