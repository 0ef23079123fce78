package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/lockd/lockd/internal/tlsfiles"
)

// lockctl tls makes the certificates of a cluster, as consul tls ca create
// and consul tls cert create do: a CA, member certificates that carry the
// member identity lockd's peer TLS checks (tlsfiles.MemberURI, the one
// definition of it), and client certificates. Keys are ECDSA P-256, PEM,
// PKCS #8, mode 0600.

// clusterOU marks a CA (and the certificates it signs) with the cluster id
// it was made for, so tls cert finds it without --cluster-id.
const clusterOU = "lockd cluster "

// tlsReply is the -o json of tls init and tls cert.
type tlsReply struct {
	Cert      string   `json:"cert"`
	Key       string   `json:"key"`
	ClusterID string   `json:"cluster_id"`
	URI       string   `json:"uri,omitempty"`
	Hosts     []string `json:"hosts,omitempty"`
	NotAfter  string   `json:"not_after"`
}

func (e *env) tlsCmd() *cobra.Command {
	c := group(&cobra.Command{
		Use:   "tls",
		Short: "make a CA and the certificates of members and clients (needs no cluster)",
		Long: `Make the certificates a cluster with TLS needs (no cluster needed): a CA,
a certificate per member, and client certificates for lockctl and
applications. A member certificate carries the URI SAN
spiffe://lockd/<cluster-id>/member/<id> that members check of each other on
the Raft port (lockd --peer-cert), the hosts it is reached at, and serves
the client API as well (lockd --tls-cert); a client certificate carries
spiffe://lockd/<cluster-id>/client/<name>, which no member accepts as a
peer. docs/OPERATIONS.md (TLS) walks through a 3-member cluster with them.`,
		Example: `  lockctl tls init --dir certs --cluster-id prod
  lockctl tls cert member --dir certs --id n1 --host 10.0.0.1,lockd1.example.com
  lockctl tls cert client --dir certs --name alice`,
	}, "init or cert")
	certs := group(&cobra.Command{
		Use:   "cert",
		Short: "make a member or a client certificate, signed by the CA of tls init",
	}, "member or client")
	certs.AddCommand(e.tlsMemberCmd(), e.tlsClientCmd())
	c.AddCommand(e.tlsInitCmd(), certs)
	return c
}

// tlsCommon are the flags of every tls command.
type tlsCommon struct {
	dir, cluster string
	days         int
	force        bool
}

func (t *tlsCommon) flags(c *cobra.Command, days int, what string) {
	c.Flags().StringVar(&t.dir, "dir", ".", "directory to write the files to (and to read the CA from)")
	c.Flags().IntVar(&t.days, "days", days, "how many days the "+what+" is valid")
	c.Flags().BoolVar(&t.force, "force", false, "replace existing files")
	_ = c.MarkFlagDirname("dir")
}

func (e *env) tlsInitCmd() *cobra.Command {
	var t tlsCommon
	c := &cobra.Command{
		Use:   "init [--dir D] [--cluster-id ID]",
		Short: "make a CA: ca.pem and ca-key.pem (ECDSA P-256, 10 years)",
		Long: `Make a new certificate authority in D: ca.pem, the CA certificate to give
every member (lockd --peer-ca, --client-ca) and every client (lockctl
--cacert), and ca-key.pem (mode 0600), its private key, which signs the
member and client certificates: keep it off the members, offline if you
can. The CA records --cluster-id, so tls cert uses it without being told.
Refuses to replace existing files unless --force (certificates signed by
the old CA are then no longer trusted by whoever gets the new ca.pem).`,
		Args: positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			if err := t.check(c); err != nil {
				return err
			}
			return status(e.tlsInit(&t))
		},
	}
	t.flags(c, 3650, "CA")
	c.Flags().StringVar(&t.cluster, "cluster-id", tlsfiles.DefaultCluster, "the cluster `ID` (lockd --cluster-id) the CA is for: tls cert's default")
	return c
}

func (e *env) tlsMemberCmd() *cobra.Command {
	var t tlsCommon
	var id, hosts, ca, caKey string
	c := &cobra.Command{
		Use:   "member --id ID [--host H,H...] [--cluster-id ID] [--dir D]",
		Short: "make member ID's certificate: member-ID.pem and member-ID-key.pem",
		Long: `Make the certificate of member ID (lockd --id), signed by the CA in D:
member-ID.pem and member-ID-key.pem (mode 0600). Its SANs are the hosts
(--host: IP addresses and DNS names, comma-separated: every address clients
and the other members reach it at, its --http-addr and --raft-addr hosts)
and the URI spiffe://lockd/<cluster-id>/member/<id>, which the other members
check on the Raft port. It is good for server and client authentication, so
one file serves both lockd --tls-cert (the client API) and --peer-cert
(Raft and member-to-member calls). --cluster-id defaults to the one the CA
was made for (tls init --cluster-id), else "default".`,
		Example: `  lockctl tls cert member --dir certs --id n1 --host 10.0.0.1,lockd1.example.com`,
		Args:    positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			if err := t.check(c); err != nil {
				return err
			}
			if err := checkName("--id", id); err != nil {
				return fmt.Errorf("tls cert member: %w", err)
			}
			hs, err := splitHosts(hosts)
			if err != nil {
				return fmt.Errorf("tls cert member: --host: %w", err)
			}
			return status(e.tlsCert(c, &t, certSpec{kind: "member", name: id, hosts: hs, ca: ca, caKey: caKey}))
		},
	}
	t.flags(c, 365, "certificate")
	c.Flags().StringVar(&id, "id", "", "the member's `ID`, its lockd --id (required)")
	c.Flags().StringVar(&hosts, "host", "localhost,127.0.0.1,::1", "`HOSTS` the member is reached at: IP addresses and DNS names, comma-separated")
	c.Flags().StringVar(&t.cluster, "cluster-id", "", "the cluster `ID`, lockd --cluster-id (default: the CA's, else \"default\")")
	c.Flags().StringVar(&ca, "ca", "", "the CA certificate (default D/ca.pem)")
	c.Flags().StringVar(&caKey, "ca-key", "", "the CA's private key (default D/ca-key.pem)")
	return c
}

func (e *env) tlsClientCmd() *cobra.Command {
	var t tlsCommon
	var name, ca, caKey string
	c := &cobra.Command{
		Use:   "client --name NAME [--cluster-id ID] [--dir D]",
		Short: "make a client certificate: client-NAME.pem and client-NAME-key.pem",
		Long: `Make a client certificate for NAME (a person or an application), signed by
the CA in D: client-NAME.pem and client-NAME-key.pem (mode 0600), for
lockctl --cert/--key (or client.Config.TLSConfig) against members that
require client certificates (lockd --client-ca). It is good for client
authentication only and carries the URI spiffe://lockd/<cluster-id>/client/<name>,
so no member accepts it on the Raft port, whatever CA signed it.`,
		Example: `  lockctl tls cert client --dir certs --name alice`,
		Args:    positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			if err := t.check(c); err != nil {
				return err
			}
			if err := checkName("--name", name); err != nil {
				return fmt.Errorf("tls cert client: %w", err)
			}
			return status(e.tlsCert(c, &t, certSpec{kind: "client", name: name, ca: ca, caKey: caKey}))
		},
	}
	t.flags(c, 365, "certificate")
	c.Flags().StringVar(&name, "name", "", "the client's `NAME` (required)")
	c.Flags().StringVar(&t.cluster, "cluster-id", "", "the cluster `ID`, lockd --cluster-id (default: the CA's, else \"default\")")
	c.Flags().StringVar(&ca, "ca", "", "the CA certificate (default D/ca.pem)")
	c.Flags().StringVar(&caKey, "ca-key", "", "the CA's private key (default D/ca-key.pem)")
	return c
}

func (t *tlsCommon) check(c *cobra.Command) error {
	if t.days < 1 {
		return fmt.Errorf("%s: --days %d: want 1 or more", subPath(c), t.days)
	}
	if t.cluster != "" {
		if err := tlsfiles.ValidateCluster(t.cluster); err != nil {
			return fmt.Errorf("%s: --cluster-id: %w", subPath(c), err)
		}
	}
	return nil
}

// checkName checks a member id or client name: what lockd takes as an id
// and what the URI SAN can carry as one path segment.
func checkName(flag, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is required", flag)
	case len(s) > 128:
		return fmt.Errorf("%s %q: at most 128 bytes", flag, s)
	case strings.ContainsAny(s, "/\\"), strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }):
		return fmt.Errorf("%s %q: no slashes, spaces or control characters", flag, s)
	}
	return nil
}

// splitHosts splits --host into IP addresses and DNS names.
func splitHosts(s string) ([]string, error) {
	var out []string
	for _, h := range strings.Split(s, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if strings.Contains(h, "://") || (net.ParseIP(h) == nil && strings.Contains(h, ":")) {
			return nil, fmt.Errorf("%q: give hosts only, without scheme or port", h)
		}
		if net.ParseIP(h) == nil && strings.ContainsFunc(h, func(r rune) bool {
			return !(r == '.' || r == '-' || r == '*' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
		}) {
			return nil, fmt.Errorf("%q is neither an IP address nor a DNS name", h)
		}
		out = append(out, h)
	}
	if len(out) == 0 {
		return nil, errors.New("want at least one host")
	}
	return out, nil
}

func (e *env) tlsInit(t *tlsCommon) int {
	certFile, keyFile := filepath.Join(t.dir, "ca.pem"), filepath.Join(t.dir, "ca-key.pem")
	if code, ok := e.mayWrite("tls init", t.force, certFile, keyFile); !ok {
		return code
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return e.tlsFailed("tls init", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "lockd CA " + t.cluster, OrganizationalUnit: []string{clusterOU + t.cluster}},
		NotBefore:             now.Add(-5 * time.Minute), // clocks of other hosts may lag
		NotAfter:              now.AddDate(0, 0, t.days),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true, // it signs leaves only
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return e.tlsFailed("tls init", err)
	}
	if err := writeKeyPair(certFile, keyFile, der, key); err != nil {
		return e.tlsFailed("tls init", err)
	}
	e.print(tlsReply{Cert: certFile, Key: keyFile, ClusterID: t.cluster, NotAfter: tmpl.NotAfter.UTC().Format(time.RFC3339)}, fmt.Sprintf(
		"wrote CA certificate %s (cluster %s, valid until %s): give it to every member (lockd --peer-ca, --client-ca) and client (lockctl --cacert)\n"+
			"wrote CA key %s (mode 0600): it signs members and clients; keep it off the members, offline if you can\n"+
			"next: lockctl tls cert member --dir %s --id n1 --host <its addresses>",
		certFile, t.cluster, tmpl.NotAfter.Format(time.DateOnly), keyFile, t.dir))
	return exitOK
}

// certSpec is what tls cert makes.
type certSpec struct {
	kind      string // member or client
	name      string
	hosts     []string
	ca, caKey string
}

func (e *env) tlsCert(c *cobra.Command, t *tlsCommon, s certSpec) int {
	what := "tls cert " + s.kind
	if s.ca == "" {
		s.ca = filepath.Join(t.dir, "ca.pem")
	}
	if s.caKey == "" {
		s.caKey = filepath.Join(t.dir, "ca-key.pem")
	}
	caCert, caSigner, err := loadCA(s.ca, s.caKey)
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl: %s: %s (make one with lockctl tls init --dir %s)\n", safe(what), safe(err.Error()), safe(t.dir))
		return exitError
	}
	cluster := t.cluster
	if !c.Flags().Changed("cluster-id") {
		cluster = tlsfiles.DefaultCluster
		for _, ou := range caCert.Subject.OrganizationalUnit {
			if id, ok := strings.CutPrefix(ou, clusterOU); ok && tlsfiles.ValidateCluster(id) == nil {
				cluster = id
			}
		}
	}
	base := filepath.Join(t.dir, s.kind+"-"+s.name)
	certFile, keyFile := base+".pem", base+"-key.pem"
	if code, ok := e.mayWrite(what, t.force, certFile, keyFile); !ok {
		return code
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return e.tlsFailed(what, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.name, OrganizationalUnit: []string{clusterOU + cluster}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.AddDate(0, 0, t.days),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if tmpl.NotAfter.After(caCert.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter // not valid beyond its CA
	}
	var uri *url.URL
	if s.kind == "member" {
		uri = tlsfiles.MemberURI(cluster, s.name)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		for _, h := range s.hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	} else {
		uri = tlsfiles.ClientURI(cluster, s.name)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	tmpl.URIs = []*url.URL{uri}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caSigner)
	if err != nil {
		return e.tlsFailed(what, err)
	}
	if err := writeKeyPair(certFile, keyFile, der, key); err != nil {
		return e.tlsFailed(what, err)
	}
	text := fmt.Sprintf("wrote %s certificate %s (%s, valid until %s)", s.kind, certFile, uri, tmpl.NotAfter.Format(time.DateOnly))
	if s.kind == "member" {
		text += fmt.Sprintf("\n  hosts: %s\n  use: lockd --id %s --cluster-id %s --tls-cert %s --tls-key %s --peer-cert %s --peer-key %s --peer-ca %s",
			strings.Join(s.hosts, ", "), s.name, cluster, certFile, keyFile, certFile, keyFile, s.ca)
	} else {
		text += fmt.Sprintf("\n  use: lockctl --cacert %s --cert %s --key %s ...", s.ca, certFile, keyFile)
	}
	text += fmt.Sprintf("\nwrote its key %s (mode 0600)", keyFile)
	e.print(tlsReply{Cert: certFile, Key: keyFile, ClusterID: cluster, URI: uri.String(), Hosts: s.hosts,
		NotAfter: tmpl.NotAfter.UTC().Format(time.RFC3339)}, text)
	return exitOK
}

func (e *env) tlsFailed(what string, err error) int {
	fmt.Fprintf(e.stderr, "lockctl: %s: %s\n", safe(what), safe(err.Error()))
	return exitError
}

// mayWrite refuses to replace files that exist, unless force, and makes
// their directory (mode 0700: it holds keys) when there is none.
func (e *env) mayWrite(what string, force bool, files ...string) (int, bool) {
	for _, f := range files {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			fmt.Fprintf(e.stderr, "lockctl: %s: %s\n", safe(what), safe(err.Error()))
			return exitError, false
		}
		fi, err := os.Lstat(f)
		switch {
		case err == nil && !fi.Mode().IsRegular():
			fmt.Fprintf(e.stderr, "lockctl: %s: %s exists and is not a regular file\n", safe(what), safe(f))
			return exitError, false
		case err == nil && !force:
			fmt.Fprintf(e.stderr, "lockctl: %s: %s exists; not replacing it (pass --force to replace it)\n", safe(what), safe(f))
			return exitError, false
		}
	}
	return exitOK, true
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

// writeKeyPair writes the key (mode 0600) and the certificate (0644), each
// to a temporary file beside it, renamed over it.
func writeKeyPair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	syncDir(dir)
	return nil
}

// loadCA reads the CA certificate and its key (PKCS #8, or an "EC PRIVATE
// KEY" as openssl writes it), and checks they belong together.
func loadCA(certFile, keyFile string) (*x509.Certificate, crypto.Signer, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	blk, _ := pem.Decode(cb)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, nil, fmt.Errorf("%s is not a CA certificate", certFile)
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	kblk, _ := pem.Decode(kb)
	if kblk == nil {
		return nil, nil, fmt.Errorf("%s: no PEM private key", keyFile)
	}
	var k any
	switch kblk.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(kblk.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(kblk.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(kblk.Bytes)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not a signing key", keyFile)
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := signer.Public().(equaler); !ok || !pub.Equal(cert.PublicKey) {
		return nil, nil, fmt.Errorf("%s is not the key of %s", keyFile, certFile)
	}
	return cert, signer, nil
}
