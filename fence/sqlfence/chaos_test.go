package sqlfence_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
	"github.com/lockd/lockd/internal/testutil"
)

// TestFrozenHolderRefusedByPostgres is the whole story with real processes:
// a one-member lockd that signs its grants, and a holder (this test binary
// run again) that takes the lock and writes to PostgreSQL through sqlfence.
// The holder is frozen with SIGSTOP, for real: no renewal, no keepalive. Its
// TTL runs out, lockd grants the lock to the next holder, which writes. The
// frozen holder is woken and writes with its old token: PostgreSQL refuses
// it, in the transaction that would have written its row.
func TestFrozenHolderRefusedByPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs lockd")
	}
	db := openPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE entries (id bigserial PRIMARY KEY, writer text NOT NULL, token numeric(20,0) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	signing, verify := filepath.Join(dir, "signing.pem"), filepath.Join(dir, "verify.pem")
	if err := fence.GenerateKeyFiles(signing, verify); err != nil {
		t.Fatal(err)
	}
	pub, err := fence.LoadPublicKey(verify)
	if err != nil {
		t.Fatal(err)
	}
	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.Postgres, VerifyKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	lockd := startLockd(t, "--signing-key", signing)

	const ttl = time.Second
	holder := startWorker(t, workerConfig{Lockd: lockd, DSN: dsnOf(t, db), Lock: "ledger", Key: "ledger", TTL: ttl, VerifyKey: pub})
	ev := holder.next(t, "acquired")
	tokenA := ev.Token
	if !ev.Proof {
		t.Fatal("lockd --signing-key granted without a proof")
	}
	for i := 0; i < 2; i++ {
		holder.send(t, "write")
		holder.next(t, "wrote")
	}

	// Freeze the holder while it waits for its next command: outside any
	// transaction, so nothing of it holds the guard row.
	holder.stop(t)
	b, err := client.New(ctx, client.Config{Endpoints: []string{lockd}, ClientID: "holder-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	lockB, err := b.Acquire(ctx, "ledger", client.WithTTL(10*time.Second), client.WithWaitTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("B waited %v for the frozen holder's TTL (%v) to run out; tokens A %d, B %d", time.Since(start).Round(time.Millisecond), ttl, tokenA, lockB.Token())
	if lockB.Token() <= tokenA {
		t.Fatalf("B's token %d is not above A's %d", lockB.Token(), tokenA)
	}
	err = f.Do(ctx, "ledger", sqlfence.CredentialsOf(lockB), func(ctx context.Context, tx sqlfence.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO entries (writer, token) VALUES ('B', $1)`, lockB.Token())
		return err
	})
	if err != nil {
		t.Fatalf("B's write: %v", err)
	}

	// The command is in the pipe before the holder wakes: its first act
	// awake is a write with the token it still believes in.
	holder.send(t, "write")
	holder.cont(t)
	ev = holder.next(t, "refused")
	if !ev.Stale || ev.Highest != lockB.Token() || ev.Token != tokenA {
		t.Fatalf("the woken holder's write: %+v, want refused as stale (token %d, highest %d)", ev, tokenA, lockB.Token())
	}
	t.Logf("refused: %s", ev.Err)
	holder.wait(t)

	rows, err := db.QueryContext(ctx, `SELECT writer, token::text FROM entries ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var w, tok string
		if err := rows.Scan(&w, &tok); err != nil {
			t.Fatal(err)
		}
		got = append(got, w+tok)
	}
	want := fmt.Sprintf("A%d,A%d,B%d", tokenA, tokenA, lockB.Token())
	if strings.Join(got, ",") != want {
		t.Fatalf("entries = %v, want %s: no row of the frozen holder after B's", got, want)
	}
	wantRecord(t, f, "ledger", lockB.Token(), "ledger")
}

// startLockd runs a one-member lockd (built once per test binary) on free
// loopback ports and returns its URL once it is ready.
func startLockd(t *testing.T, extra ...string) string {
	t.Helper()
	bin := builds.Path(t, "lockd")
	dir := t.TempDir()
	httpAddr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	raftAddr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "lockd.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	args := append([]string{"--id", "n1", "--data-dir", filepath.Join(dir, "data"), "--http-addr", httpAddr, "--raft-addr", raftAddr}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- lockd log ---\n%s", b)
		}
	})
	url := "http://" + httpAddr
	testutil.WaitFor(t, 30*time.Second, "lockd to be ready", func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("lockd exited while starting:\n%s", b)
		default:
		}
		return testutil.Get(url+"/readyz").Status == 200
	})
	return url
}

// dsnOf returns the DSN db was opened with, for another process.
func dsnOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	if err := db.QueryRow(`SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return pg.Server(t).DSN(name)
}

// worker is the holder process as the test drives it.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan workerEvent
	stderr *testutil.SyncBuffer
}

func startWorker(t *testing.T, cfg workerConfig) *worker {
	t.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{events: make(chan workerEvent, 16), stderr: &testutil.SyncBuffer{}}
	w.cmd = exec.Command(exe)
	w.cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
	w.cmd.Stderr = w.stderr
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e workerEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				w.events <- e
			}
		}
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		_ = w.stdin.Close()
		for range w.events { // the reader ends at EOF
		}
		_ = w.cmd.Wait()
		if t.Failed() {
			t.Logf("--- holder's stderr ---\n%s", w.stderr.String())
		}
	})
	return w
}

func (w *worker) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(w.stdin, line+"\n"); err != nil {
		t.Fatalf("holder's stdin: %v", err)
	}
}

// next returns the holder's next event, which must be want.
func (w *worker) next(t *testing.T, want string) workerEvent {
	t.Helper()
	select {
	case e, ok := <-w.events:
		if !ok {
			t.Fatalf("the holder ended before %q", want)
		}
		if e.Ev != want {
			t.Fatalf("the holder said %+v, want %q", e, want)
		}
		return e
	case <-time.After(60 * time.Second):
		t.Fatalf("no %q from the holder within 60s", want)
	}
	return workerEvent{}
}

// stop freezes the holder and waits until the kernel reports it stopped.
func (w *worker) stop(t *testing.T) {
	t.Helper()
	pid := w.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED|syscall.WNOHANG, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			t.Fatalf("wait for the holder's stop: %v", err)
		case wpid == pid && ws.Stopped():
			return
		case wpid == pid:
			t.Fatalf("the holder ended instead of stopping: %v", ws)
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder did not stop within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *worker) cont(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(w.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// wait waits for the holder to exit by itself, successfully.
func (w *worker) wait(t *testing.T) {
	t.Helper()
	_ = w.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- w.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the holder: %v\n%s", err, w.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not exit within 30s")
	}
}
