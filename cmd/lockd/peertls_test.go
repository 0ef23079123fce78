package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockd/lockd/internal/testutil"
)

// TestPeerCertificateMustNameTheMember: lockd refuses to start with a
// --peer-cert that is not the member certificate of its --id in its
// --cluster-id (the other members would refuse it on the Raft port), and
// refuses a malformed --cluster-id.
func TestPeerCertificateMustNameTheMember(t *testing.T) {
	ca := testutil.NewCA(t, "ca")
	addr := func() string {
		a, err := testutil.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	type certs func() (string, string)
	cases := []struct {
		name  string
		issue certs
		extra []string
		want  string
	}{
		{"client certificate", func() (string, string) { return ca.Issue("n1") }, nil, "spiffe://lockd/default/member/<id>"},
		{"another member", func() (string, string) { return ca.IssueMember("default", "n2") }, nil, "spiffe://lockd/default/member/n1"},
		{"another cluster", func() (string, string) { return ca.IssueMember("prod", "n1") }, nil, "another cluster"},
		{"member of --cluster-id", func() (string, string) { return ca.IssueMember("default", "n1") }, []string{"--cluster-id", "prod"}, "another cluster"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cert, key := c.issue()
			args := append([]string{"--id", "n1", "--data-dir", t.TempDir(), "--http-addr", addr(), "--raft-addr", addr(),
				"--peer-cert", cert, "--peer-key", key, "--peer-ca", ca.CertPEM}, c.extra...)
			var stderr bytes.Buffer
			if code := run(args, &stderr); code != 1 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, want 1 with %q in:\n%s", code, c.want, stderr.String())
			}
		})
	}
	var stderr bytes.Buffer
	if code := run([]string{"--cluster-id", "a/b"}, &stderr); code != 2 || !strings.Contains(stderr.String(), "--cluster-id") {
		t.Fatalf("--cluster-id a/b: exit %d:\n%s", code, stderr.String())
	}
}
