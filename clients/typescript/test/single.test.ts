// The client against single-member clusters: a session that cannot be kept
// alive (the member SIGSTOPped), fencing tokens above 2^53 end to end, and
// TLS with client certificates and bearer tokens.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import * as https from "node:https";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import {
  Client,
  type ClientOptions,
  HTTPSRequiredError,
  LeaseExpiredError,
  NoLeaderError,
  PermissionDeniedError,
  UnauthenticatedError,
} from "../src/index.js";
import { Cluster, bin, fencedPut, poll, startFencestore, stopProcess, within, work } from "./harness.js";

const T = { timeout: 60000 };
const clients: Client[] = [];
const clusters: Cluster[] = [];

after(async () => {
  await Promise.allSettled(clients.map((c) => c.close()));
  await Promise.all(clusters.map((c) => c.stop()));
});

async function single(o: Parameters<typeof Cluster.start>[1] = {}): Promise<Cluster> {
  const c = await Cluster.start(1, o);
  clusters.push(c);
  return c;
}

async function connect(o: ClientOptions): Promise<Client> {
  const c = await Client.connect(o);
  clients.push(c);
  return c;
}

function aborted(signal: AbortSignal): Promise<unknown> {
  if (signal.aborted) return Promise.resolve(signal.reason);
  return new Promise((r) => signal.addEventListener("abort", () => r(signal.reason), { once: true }));
}

describe("a session that cannot be kept alive", () => {
  test("the member SIGSTOPped: the lock's signal aborts on the local lease, before the server can give the lock away", T, async () => {
    const cl = await single();
    const m = cl.members[0]!;
    const ttl = 2000;
    const a = await connect({ endpoints: cl.endpoints, sessionTtlMs: ttl, clientId: "stop-a", attemptTimeoutMs: 500 });
    const firstSession = a.sessionId;
    const l = await a.acquire("stop/x");
    await new Promise((r) => setTimeout(r, 300));
    const t0 = performance.now();
    m.pause();
    const reason = await within(aborted(l.signal), ttl + 1000, "the loss signal");
    const took = performance.now() - t0;
    assert.ok(reason instanceof LeaseExpiredError, String(reason));
    // The lease ends at the last confirmed keepalive's send time (at most
    // TTL/3 before the stop) + TTL - margin: never after the server could
    // expire the session (TTL after it received that keepalive).
    assert.ok(took < ttl, `lost ${took} ms after the stop`);
    assert.ok(took > ttl / 3, `lost ${took} ms after the stop: too early`);
    assert.ok(a.sessionSignal.aborted);
    m.resume();
    // Once the member is back, the client ends the given-up session and
    // opens a new one; another client gets the lock with a higher token.
    const b = await connect({ endpoints: cl.endpoints, sessionTtlMs: ttl, clientId: "stop-b" });
    const lb = await b.acquire("stop/x", { waitTimeoutMs: 10000 });
    assert.ok(lb.fencingToken > l.fencingToken);
    await lb.release();
    await poll("a new session", 10000, () => (a.sessionId && a.sessionId !== firstSession && a.current ? true : undefined));
    const again = await a.acquire("stop/x", { waitTimeoutMs: 5000 });
    await again.release();
  });
});

describe("a member refusing work as overloaded", () => {
  test("admission limits of 1: acquires refused with retry_after_ms are sent again after it and all granted", T, async () => {
    const cl = await single({ extraArgs: ["--admission-max", "1", "--admission-min", "1"] });
    let refusals = 0;
    const a = await connect({
      endpoints: cl.endpoints,
      clientId: "busy-a",
      logger: { info: (msg) => void (msg.includes("overloaded") && refusals++) },
    });
    const ls = await Promise.all(Array.from({ length: 30 }, (_, i) => a.acquire(`busy/${i}`, { waitTimeoutMs: 20000 })));
    assert.equal(new Set(ls.map((l) => l.fencingToken)).size, 30);
    assert.ok(refusals > 0, "the member refused nothing: the admission limits did not bite");
    await Promise.all(ls.map((l) => l.release()));
  });
});

describe("fencing tokens above 2^53", () => {
  test("a restore with min_token near 2^64: grants, status, watches and fenced writes keep every digit", T, async () => {
    const cl = await single();
    const base = cl.endpoints[0]!;
    const snap = await fetch(`${base}/api/v1/snapshot`);
    assert.equal(snap.status, 200);
    const body = Buffer.from(await snap.arrayBuffer());
    const min = (1n << 64n) - 1000n;
    const r = await fetch(`${base}/api/v1/snapshot/restore?force=true&min_token=${min}`, { method: "POST", headers: { "Content-Type": "application/octet-stream" }, body });
    assert.equal(r.status, 200, await r.text());
    await cl.ready();
    const fs = await startFencestore();
    try {
      const a = await connect({ endpoints: cl.endpoints, clientId: "big-a" });
      const it = a.watch({ lock: "big/x" });
      await within(it.next(), 5000, "the first picture");
      const l = await a.acquire("big/x");
      assert.ok(l.fencingToken > min, `token ${l.fencingToken}`);
      assert.ok(l.fencingToken > BigInt(Number.MAX_SAFE_INTEGER));
      const ch = await within(it.next(), 5000, "the grant's change");
      assert.equal(ch.value!.status.holders[0]!.fencingToken, l.fencingToken);
      assert.equal((await a.status("big/x")).holders[0]!.fencingToken, l.fencingToken);
      const w = await fencedPut(fs.url, "big/key", "v", l.fencingHeaders());
      assert.equal(w.status, 200, JSON.stringify(w.body));
      const g = await fetch(`${fs.url}/v1/objects/big%2Fkey`);
      assert.equal(g.headers.get("fencing-token"), l.fencingToken.toString());
      await l.release();
      const l2 = await a.acquire("big/x");
      assert.equal(l2.fencingToken > l.fencingToken, true);
      assert.deepEqual(await a.revoke("big/x", l2.fencingToken), [l2.fencingToken]);
      await it.return();
    } finally {
      await stopProcess(fs.proc);
    }
  });
});

describe("TLS and bearer tokens", () => {
  test("https with a client certificate and a token; a refused token fails at once; access is checked", T, async () => {
    const dir = join(work(), "tls");
    const lockctl = bin("lockctl");
    execFileSync(lockctl, ["tls", "init", "--dir", dir], { stdio: "ignore" });
    execFileSync(lockctl, ["tls", "cert", "member", "--id", "n1", "--host", "127.0.0.1", "--dir", dir], { stdio: "ignore" });
    execFileSync(lockctl, ["tls", "cert", "client", "--name", "app", "--dir", dir], { stdio: "ignore" });
    const tokens = join(dir, "tokens.json");
    writeFileSync(
      tokens,
      JSON.stringify({
        tokens: [
          { name: "app", token: "app-token-0123456789", permissions: [{ prefix: "app/", access: "lock" }] },
          { name: "admin", token: "admin-token-0123456789", permissions: [{ prefix: "", access: "admin" }] },
          { name: "reader", token: "reader-token-0123456789", permissions: [{ prefix: "app/", access: "read" }] },
        ],
      }),
    );
    const pem = (f: string) => readFileSync(join(dir, f));
    const tls = { ca: pem("ca.pem"), cert: pem("client-app.pem"), key: pem("client-app-key.pem") };
    const cl = await single({
      scheme: "https",
      extraArgs: ["--tls-cert", join(dir, "member-n1.pem"), "--tls-key", join(dir, "member-n1-key.pem"), "--client-ca", join(dir, "ca.pem"), "--auth-file", tokens],
    });
    const url = cl.endpoints[0]!;
    await poll("the https member ready", 20000, () =>
      new Promise<true | undefined>((res) => {
        const req = https.get(`${url}/readyz`, { ...tls, timeout: 2000 }, (r) => {
          r.resume();
          res(r.statusCode === 200 ? true : undefined);
        });
        req.on("error", () => res(undefined));
      }),
    );

    const a = await connect({ endpoints: [url], tls, token: "app-token-0123456789", clientId: "tls-a" });
    const l = await a.acquire("app/x");
    assert.equal((await a.status("app/x")).holders[0]!.clientId, "tls-a");
    await assert.rejects(a.tryAcquire("other/x"), PermissionDeniedError);
    // A watch the server refuses: its iterator throws the refusal.
    const w = a.watch({ prefix: "other/" });
    await assert.rejects(w.next(), PermissionDeniedError);
    await l.release();

    // A token with read access only: a read-only client, without a session,
    // that watches; its acquires are refused.
    const reader = await connect({ endpoints: [url], tls, token: "reader-token-0123456789", clientId: "tls-reader" });
    assert.equal(reader.readOnly, true);
    assert.equal(reader.sessionId, "");
    assert.equal(a.readOnly, false);
    await assert.rejects(reader.tryAcquire("app/y"), PermissionDeniedError);
    const rw = reader.watch({ prefix: "app/" });
    await within(rw.ready, 5000, "the read-only watch accepted");
    const l2 = await a.acquire("app/w");
    const seen = await within(rw.next(), 5000, "a change seen by the read-only watch");
    assert.equal(seen.value!.lock, "app/w");
    assert.equal(seen.value!.status.holders[0]!.fencingToken, l2.fencingToken);
    // The token file reloaded without the reader's access to app/: the
    // server ends the watch, and its iterator says why.
    writeFileSync(
      tokens,
      JSON.stringify({
        tokens: [
          { name: "app", token: "app-token-0123456789", permissions: [{ prefix: "app/", access: "lock" }] },
          { name: "reader", token: "reader-token-0123456789", permissions: [{ prefix: "other/", access: "read" }] },
        ],
      }),
    );
    cl.members[0]!.proc!.kill("SIGHUP");
    const ended = await within(
      (async () => {
        for (;;) {
          const r = await rw.next(); // changes until the end
          if (r.done) return new Error("the watch ended without an error");
        }
      })().catch((e: unknown) => e),
      10000,
      "the end of the watch after the reload",
    );
    assert.ok(ended instanceof PermissionDeniedError || ended instanceof UnauthenticatedError, String(ended));
    await l2.release();

    const t0 = performance.now();
    await assert.rejects(Client.connect({ endpoints: [url], tls, token: "wrong-token-0123456789", dialTimeoutMs: 10000 }), UnauthenticatedError);
    assert.ok(performance.now() - t0 < 3000, "a refused token was retried");
    await assert.rejects(Client.connect({ endpoints: [url.replace("https:", "http:")], tls, token: "app-token-0123456789", dialTimeoutMs: 10000 }), HTTPSRequiredError);
    // Without the client certificate the TLS handshake fails: no leader reachable.
    await assert.rejects(Client.connect({ endpoints: [url], tls: { ca: tls.ca }, token: "app-token-0123456789", dialTimeoutMs: 1000 }), NoLeaderError);
  });
});
