package e2e

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/testutil"
)

// fencKeys writes a key pair with the real `lockctl keygen` and loads it.
func fencKeys(t *testing.T) (privPath, pubPath string, pub ed25519.PublicKey) {
	t.Helper()
	dir := t.TempDir()
	privPath, pubPath = filepath.Join(dir, "lockd-signing.pem"), filepath.Join(dir, "lockd-verify.pem")
	out, err := exec.Command(Bin(t, "lockctl"), "keygen", "--private", privPath, "--public", pubPath).CombinedOutput()
	if err != nil {
		t.Fatalf("lockctl keygen: %v\n%s", err, out)
	}
	if out, err := exec.Command(Bin(t, "lockctl"), "keygen", "--private", privPath, "--public", pubPath).CombinedOutput(); err == nil {
		t.Fatalf("lockctl keygen replaced an existing key without --force:\n%s", out)
	}
	pub, err = fence.LoadPublicKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	return privPath, pubPath, pub
}

// fencStore is a running fencestore process.
type fencStore struct {
	url string
	cmd *exec.Cmd
	log string
}

// startFencStore runs the fencestore binary on a free loopback port and
// waits for /healthz. It is killed at the end of the test.
func startFencStore(t *testing.T, extra ...string) *fencStore {
	t.Helper()
	dir := t.TempDir()
	addr := freePort(t)
	fs := &fencStore{url: "http://" + addr, log: filepath.Join(dir, "fencestore.log")}
	f, err := os.Create(fs.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := append([]string{"--addr", addr, "--data-dir", filepath.Join(dir, "data")}, extra...)
	fs.cmd = exec.Command(Bin(t, "fencestore"), args...)
	fs.cmd.Stdout, fs.cmd.Stderr = f, f
	if err := fs.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = fs.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = fs.cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(fs.log)
			t.Logf("--- log of fencestore %s ---\n%s", fs.url, b)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(fs.log)
			t.Fatalf("fencestore exited while starting:\n%s", b)
		default:
		}
		if r := testutil.Get(fs.url + "/healthz"); r.Status == http.StatusOK {
			return fs
		}
		if time.Now().After(deadline) {
			t.Fatal("fencestore not healthy within 30s")
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// fencWrite is one PUT to fencestore; empty lock or proof leaves the header
// out.
type fencWrite struct {
	key, lock, proof, value string
	token                   uint64
}

// fencReply is fencestore's answer.
type fencReply struct {
	status  int
	code    string
	highest uint64
	raw     string
}

func (fs *fencStore) put(t *testing.T, w fencWrite) fencReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, fs.url+"/v1/objects/"+w.key, strings.NewReader(w.value))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(fence.HeaderToken, strconv.FormatUint(w.token, 10))
	if w.lock != "" {
		req.Header.Set(fence.HeaderLock, w.lock)
	}
	if w.proof != "" {
		req.Header.Set(fence.HeaderProof, w.proof)
	}
	return fencDo(t, req)
}

func fencDo(t *testing.T, req *http.Request) fencReply {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Error   *api.Error `json:"error"`
		Highest uint64     `json:"highest_token"`
	}
	_ = json.Unmarshal(b, &body)
	r := fencReply{status: resp.StatusCode, highest: body.Highest, raw: string(b)}
	if body.Error != nil {
		r.code = body.Error.Code
	}
	return r
}

// get returns an object's value and its highest accepted token (0 when the
// header is absent); found is false on 404.
func (fs *fencStore) get(t *testing.T, key string) (value string, token uint64, found bool) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(fs.url + "/v1/objects/" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if h := resp.Header.Get(fence.HeaderToken); h != "" {
		if token, err = strconv.ParseUint(h, 10, 64); err != nil {
			t.Fatalf("GET %s: Fencing-Token %q: %v", key, h, err)
		}
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return string(b), token, true
	case http.StatusNotFound:
		return "", token, false
	}
	t.Fatalf("GET %s: %d %s", key, resp.StatusCode, b)
	return "", 0, false
}

func fencWant(t *testing.T, what string, r fencReply, status int, code string) {
	t.Helper()
	if r.status != status || r.code != code {
		t.Fatalf("%s: %d %q (%s), want %d %q", what, r.status, r.code, r.raw, status, code)
	}
}

// fencGrant is a lock grant from the HTTP API.
type fencGrant struct {
	lock      string
	token     uint64
	proof     string
	expiresAt string
}

// fencAcquire takes lock over HTTP, retrying 503 no_leader (a new leader
// that is not ready yet) for up to 10 s.
func fencAcquire(t *testing.T, url, lock, clientID string) fencGrant {
	t.Helper()
	var r testutil.Reply
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r = testutil.Post(url+"/api/v1/locks/"+lock+"/acquire", map[string]any{"client_id": clientID, "ttl_ms": 120000})
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	if r.Status != http.StatusOK {
		t.Fatalf("acquire %s: %d %s", lock, r.Status, r.Raw)
	}
	return fencGrant{lock: lock, token: r.Uint("fencing_token"), proof: r.Str("fencing_proof"), expiresAt: r.Str("expires_at")}
}

// flipByte returns proof with one bit of its raw bytes at i flipped, still
// valid base64 of the right length.
func flipByte(t *testing.T, proof string, i int) string {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(proof)
	if err != nil {
		t.Fatalf("proof %q is not base64: %v", proof, err)
	}
	raw[i] ^= 0x01
	return base64.StdEncoding.EncodeToString(raw)
}

// TestFencingSignedProofsEndToEnd runs a 3-member lockd cluster with
// --signing-key (keys from `lockctl keygen`) and fencestore with
// --verify-key: a grant's fencing_proof (HTTP and WebSocket, before and
// after a leader change) is accepted; a forged proof, a proof of another
// lock or token, and a missing proof or lock get 403 permission_denied and
// change nothing; a valid proof with a stale token gets 409.
func TestFencingSignedProofsEndToEnd(t *testing.T) {
	privPath, pubPath, pub := fencKeys(t)
	pc := startCluster(t, 3, "--signing-key", privPath)
	fs := startFencStore(t, "--verify-key", pubPath)

	// Through a follower: the 307 leads to the leader, which signs.
	leader := pc.leader(10 * time.Second)
	follower := pc.order[0]
	if follower == leader {
		follower = pc.order[1]
	}
	g := fencAcquire(t, pc.procs[follower].url(), "orders", "worker-1")
	if len(g.proof) != fence.ProofLen {
		t.Fatalf("grant of orders: fencing_proof %q, want %d characters", g.proof, fence.ProofLen)
	}
	exp, err := fence.Verify(pub, "orders", g.token, g.proof)
	if err != nil {
		t.Fatalf("the grant's proof does not verify with the public key from lockctl keygen: %v", err)
	}
	if want, _ := api.ParseTime(g.expiresAt); exp != want.UnixMilli() {
		t.Fatalf("proof expiry %d, grant expires_at %s (%d)", exp, g.expiresAt, want.UnixMilli())
	}
	other := fencAcquire(t, pc.procs[leader].url(), "invoices", "worker-2")
	if _, err := fence.Verify(pub, "invoices", other.token, other.proof); err != nil || other.token == g.token {
		t.Fatalf("grant of invoices: token %d proof error %v", other.token, err)
	}

	ok := fencWrite{key: "ledger", lock: "orders", token: g.token, proof: g.proof, value: "v1 by worker-1"}
	fencWant(t, "write with the grant's proof", fs.put(t, ok), http.StatusOK, "")

	// Every bad proof is refused before the token counts: a huge token
	// with a bad proof must not raise the highest.
	const huge = 1 << 40
	for _, tc := range []struct {
		name string
		w    fencWrite
	}{
		{"forged proof (a signature byte flipped)", fencWrite{lock: "orders", token: g.token, proof: flipByte(t, g.proof, 40)}},
		{"forged proof (an expiry byte flipped)", fencWrite{lock: "orders", token: g.token, proof: flipByte(t, g.proof, 7)}},
		{"forged proof (last character changed)", fencWrite{lock: "orders", token: g.token, proof: g.proof[:len(g.proof)-1] + map[bool]string{true: "A", false: "B"}[g.proof[len(g.proof)-1] != 'A']}},
		{"proof of another lock", fencWrite{lock: "orders", token: g.token, proof: other.proof}},
		{"proof sent with another lock name", fencWrite{lock: "invoices", token: g.token, proof: g.proof}},
		{"proof of another token", fencWrite{lock: "orders", token: g.token + 1, proof: g.proof}},
		{"another grant's token and proof under this lock", fencWrite{lock: "orders", token: other.token, proof: other.proof}},
		{"huge token, proof of a smaller one", fencWrite{lock: "orders", token: huge, proof: g.proof}},
		{"missing proof", fencWrite{lock: "orders", token: huge}},
		{"missing Fencing-Lock", fencWrite{token: g.token, proof: g.proof}},
		{"proof signed by another key", fencWrite{lock: "orders", token: huge, proof: fencForeignProof(t, "orders", huge)}},
	} {
		tc.w.key, tc.w.value = "ledger", "forged by "+tc.name
		fencWant(t, tc.name, fs.put(t, tc.w), http.StatusForbidden, api.CodePermissionDenied)
	}
	if v, tok, _ := fs.get(t, "ledger"); v != "v1 by worker-1" || tok != g.token {
		t.Fatalf("after the refused writes fencestore holds %q with token %d, want %q with %d", v, tok, "v1 by worker-1", g.token)
	}
	// The same holder writes again with the same proof: accepted.
	ok.value = "v2 by worker-1"
	fencWant(t, "second write of the same grant", fs.put(t, ok), http.StatusOK, "")

	// The WebSocket grant carries a proof too; Lock.Fence sends it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, client.Config{Endpoints: pc.endpoints(), ClientID: "ws-worker"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wl, err := c.Acquire(ctx, "orders/ws", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Verify(pub, "orders/ws", wl.Token(), wl.Proof()); err != nil {
		t.Fatalf("WebSocket grant: proof %q: %v", wl.Proof(), err)
	}
	req, _ := http.NewRequest(http.MethodPut, fs.url+"/v1/objects/ws-ledger", strings.NewReader("by ws-worker"))
	wl.Fence(req)
	fencWant(t, "write fenced by Lock.Fence", fencDo(t, req), http.StatusOK, "")
	if err := wl.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Every member signs with the shared key: after the leader dies, the
	// new leader's grants verify too. worker-1's proof stays valid, but its
	// token is now stale: 409, not 403.
	pc.kill(leader)
	newLeader := pc.leader(10 * time.Second)
	// worker-1 hands the lock on; worker-3's grant of the same lock (the
	// one that guards key ledger) comes from the new leader.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := testutil.Post(pc.procs[newLeader].url()+"/api/v1/locks/orders/release", map[string]any{"client_id": "worker-1", "fencing_token": g.token})
		if r.Status == http.StatusOK {
			break
		}
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("release orders on the new leader: %d %s", r.Status, r.Raw)
		}
	}
	g2 := fencAcquire(t, pc.procs[newLeader].url(), "orders", "worker-3")
	if _, err := fence.Verify(pub, "orders", g2.token, g2.proof); err != nil {
		t.Fatalf("grant by the new leader %s: %v", newLeader, err)
	}
	if g2.token <= other.token {
		t.Fatalf("token after failover %d not above %d", g2.token, other.token)
	}
	fencWant(t, "write with the new leader's grant", fs.put(t, fencWrite{key: "ledger", lock: "orders", token: g2.token, proof: g2.proof, value: "v3 by worker-3"}), http.StatusOK, "")
	ok.value = "late write by worker-1"
	r := fs.put(t, ok)
	fencWant(t, "valid proof, stale token", r, http.StatusConflict, "stale_token")
	if r.highest != g2.token {
		t.Fatalf("409 highest_token %d, want %d", r.highest, g2.token)
	}
	if v, tok, _ := fs.get(t, "ledger"); v != "v3 by worker-3" || tok != g2.token {
		t.Fatalf("fencestore holds %q with token %d, want worker-3's value with %d", v, tok, g2.token)
	}
}

// TestFencingUnsignedLockdRefused: a lockd without --signing-key sends no
// proof, and a fencestore with --verify-key refuses its tokens (403), as it
// refuses a proof made with another key; the same tokens are accepted by a
// fencestore that does not verify proofs.
func TestFencingUnsignedLockdRefused(t *testing.T) {
	_, pubPath, _ := fencKeys(t)
	pc := startCluster(t, 1)
	verifying := startFencStore(t, "--verify-key", pubPath)
	plain := startFencStore(t)

	r := testutil.Post(pc.procs["n1"].url()+"/api/v1/locks/orders/acquire", map[string]any{"client_id": "w", "ttl_ms": 60000})
	if r.Status != http.StatusOK {
		t.Fatalf("acquire: %d %s", r.Status, r.Raw)
	}
	if _, present := r.Body["fencing_proof"]; present {
		t.Fatalf("a lockd without --signing-key sent a fencing_proof: %s", r.Raw)
	}
	token := r.Uint("fencing_token")

	w := fencWrite{key: "ledger", lock: "orders", token: token, value: "unsigned"}
	fencWant(t, "unsigned token at a verifying fencestore", verifying.put(t, w), http.StatusForbidden, api.CodePermissionDenied)
	w.proof = fencForeignProof(t, "orders", token)
	fencWant(t, "proof by a key the fencestore does not trust", verifying.put(t, w), http.StatusForbidden, api.CodePermissionDenied)
	if _, tok, found := verifying.get(t, "ledger"); found || tok != 0 {
		t.Fatalf("refused writes left an object or a token (%d) behind", tok)
	}

	w.proof = ""
	fencWant(t, "unsigned token at a fencestore without --verify-key", plain.put(t, w), http.StatusOK, "")
	if v, tok, _ := plain.get(t, "ledger"); v != "unsigned" || tok != token {
		t.Fatalf("plain fencestore holds %q with %d", v, tok)
	}
}

// fencForeignProof signs with a key of its own, not lockd's.
func fencForeignProof(t *testing.T, lock string, token uint64) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return fence.Sign(priv, lock, token, time.Now().Add(time.Minute).UnixMilli())
}
