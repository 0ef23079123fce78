package sqlfence_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// TestRefusesWhatFencestoreRefuses: random sequences of writes (tokens
// over the whole uint64 range, no lock, the key's lock, another lock, an
// invalid one; no proof, a valid, shared, expired, forged or mismatched one;
// guarded and unguarded keys; with and without a verify key) and admin
// resets go both to a fencestore server (fence.NewServer) and to sqlfence.
// Each is admitted by both or refused by both for the same reason class
// (stale, with the same highest token; denied; malformed), and afterwards
// both hold the same token and lock for every key.
func TestRefusesWhatFencestoreRefuses(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "sqlfence-model-test-seed")
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	_, forger, _ := ed25519.GenerateKey(nil)
	now := time.UnixMilli(1_800_000_000_000)
	clock := func() time.Time { return now }
	guards, err := fence.NewGuards(fence.Guard{Prefix: "g/", Lock: "L1"})
	if err != nil {
		t.Fatal(err)
	}
	const admin = "model-test-admin-token"
	keys := []string{"a", "b", "g/x"}
	tokens := rapid.OneOf(
		rapid.Uint64Range(0, 12),
		rapid.SampledFrom([]uint64{math.MaxInt64 - 1, math.MaxInt64, 1 << 63, 1<<63 + 1, math.MaxUint64 - 1, math.MaxUint64}),
	)

	eachBackend(t, func(t *testing.T, b backend) {
		db := b.open(t)
		ctx := context.Background()
		n := 0
		rapid.Check(t, func(rt *rapid.T) {
			n++
			signed := rapid.Bool().Draw(rt, "signed")
			cfg := sqlfence.Config{Dialect: b.dialect, Table: fmt.Sprintf("model_%d", n), Guards: guards, Now: clock}
			store := fence.NewMemoryStore()
			scfg := fence.ServerConfig{Store: store, Guards: guards, Now: clock, AdminToken: admin}
			if signed {
				cfg.VerifyKey, scfg.VerifyKey = pub, pub
			}
			f, err := sqlfence.New(db, cfg)
			if err != nil {
				rt.Fatal(err)
			}
			if err := f.Migrate(ctx); err != nil {
				rt.Fatal(err)
			}
			srv, err := fence.NewServer(scfg)
			if err != nil {
				rt.Fatal(err)
			}

			steps := rapid.IntRange(1, 25).Draw(rt, "steps")
			for i := 0; i < steps; i++ {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				token := tokens.Draw(rt, "token")
				if rapid.IntRange(0, 9).Draw(rt, "reset?") == 0 {
					wantPrev := resetServer(rt, srv, key, token, admin)
					prev, err := f.Reset(ctx, key, token)
					if err != nil {
						rt.Fatalf("Reset(%s, %d): %v", key, token, err)
					}
					if prev.Token != wantPrev.Token || prev.Lock != wantPrev.Lock {
						rt.Fatalf("Reset(%s, %d) returned %+v, fencestore %+v", key, token, prev, wantPrev)
					}
				} else {
					lock := rapid.SampledFrom([]string{"", "L1", "L2", "bad lock"}).Draw(rt, "lock")
					c := fence.Credentials{Token: token, Lock: lock}
					proofLock, proofToken := lock, token
					if proofLock == "" || proofLock == "bad lock" {
						proofLock = "L1"
					}
					switch rapid.SampledFrom([]string{"none", "valid", "no-expiry", "shared", "expired", "other-token", "forged"}).Draw(rt, "proof") {
					case "valid":
						c.Proof = fence.Sign(priv, proofLock, proofToken, now.Add(time.Hour).UnixMilli())
					case "no-expiry":
						c.Proof = fence.Sign(priv, proofLock, proofToken, 0)
					case "shared":
						c.Proof = fence.SignGrant(priv, fence.Grant{Lock: proofLock, Token: proofToken, Mode: fence.ModeShared, ExpiresAt: now.Add(time.Hour).UnixMilli()})
					case "expired":
						c.Proof = fence.Sign(priv, proofLock, proofToken, now.UnixMilli())
					case "other-token":
						c.Proof = fence.Sign(priv, proofLock, proofToken+1, now.Add(time.Hour).UnixMilli())
					case "forged":
						c.Proof = fence.Sign(forger, proofLock, proofToken, now.Add(time.Hour).UnixMilli())
					}
					want := putServer(rt, srv, key, c)
					ran := false
					got := classify(f.Do(ctx, key, c, func(context.Context, sqlfence.Tx) error { ran = true; return nil }))
					if got != want {
						rt.Fatalf("write %+v to %s: sqlfence %s, fencestore %s", c, key, got, want)
					}
					if ran != (got == "ok") {
						rt.Fatalf("write %+v to %s: %s, and fn ran: %v", c, key, got, ran)
					}
				}
				for _, k := range keys {
					rec, err := f.Get(ctx, k)
					if err != nil {
						rt.Fatal(err)
					}
					model, _ := store.Get(k)
					if rec.Token != model.Token || rec.Lock != model.Lock {
						rt.Fatalf("key %s: sqlfence has token %d lock %q, fencestore %d %q", k, rec.Token, rec.Lock, model.Token, model.Lock)
					}
				}
			}
		})
	})
}

// classify names what became of a write in sqlfence: "ok", "stale <highest>",
// "denied" (fencestore's 403s) or "malformed" (its 400s).
func classify(err error) string {
	var stale *fence.StaleTokenError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &stale):
		return "stale " + strconv.FormatUint(stale.Highest, 10)
	case errors.Is(err, fence.ErrInvalidLock):
		return "malformed"
	case errors.Is(err, fence.ErrLockMismatch), errors.Is(err, fence.ErrMissingProof), errors.Is(err, fence.ErrMissingLock),
		errors.Is(err, fence.ErrBadProof), errors.Is(err, fence.ErrSharedProof), errors.Is(err, fence.ErrExpiredProof):
		return "denied"
	}
	return "error: " + err.Error()
}

// putServer makes the write to fencestore and names its answer as classify
// does.
func putServer(rt *rapid.T, srv http.Handler, key string, c fence.Credentials) string {
	req := httptest.NewRequest(http.MethodPut, "/v1/objects/"+url.PathEscape(key), strings.NewReader("v"))
	req.Header.Set(fence.HeaderToken, strconv.FormatUint(c.Token, 10))
	if c.Lock != "" {
		req.Header.Set(fence.HeaderLock, c.Lock)
	}
	if c.Proof != "" {
		req.Header.Set(fence.HeaderProof, c.Proof)
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	switch w.Code {
	case http.StatusOK:
		return "ok"
	case http.StatusConflict:
		var r fence.StaleTokenReply
		if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
			rt.Fatal(err)
		}
		return "stale " + strconv.FormatUint(r.HighestToken, 10)
	case http.StatusForbidden:
		return "denied"
	case http.StatusBadRequest:
		return "malformed"
	}
	rt.Fatalf("fencestore answered %d %s", w.Code, w.Body)
	return ""
}

// resetServer resets key's fence in fencestore and returns what it had.
func resetServer(rt *rapid.T, srv http.Handler, key string, token uint64, admin string) fence.Record {
	req := httptest.NewRequest(http.MethodDelete, "/v1/objects/"+url.PathEscape(key)+"/fence?fencing_token="+strconv.FormatUint(token, 10), nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	var r fence.ResetReply
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &r) != nil {
		rt.Fatalf("fencestore reset: %d %s", w.Code, w.Body)
	}
	return fence.Record{Token: r.PreviousToken, Lock: r.PreviousLock}
}
