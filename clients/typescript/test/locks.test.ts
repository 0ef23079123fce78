// The client against a real 3-member cluster built from this repository:
// lock kinds, pushed grants, loss signals, withLock, cancellation,
// elections and watches across a reconnect.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  CancelledError,
  Client,
  type ClientOptions,
  ElectionNoLeaderError,
  ElectionNotLeaderError,
  LeaseExpiredError,
  LimitMismatchError,
  type Lock,
  LockExpiredError,
  LockHeldError,
  ReleasedError,
  RevokedError,
  WaitTimeoutError,
  type WatchChange,
} from "../src/index.js";
import { configure } from "../src/config.js";
import { HttpApi } from "../src/http.js";
import { Trust } from "../src/redirect.js";
import { Cluster, Proxy, getJSON, poll, since, within } from "./harness.js";

/** Every test is bounded. */
const T = { timeout: 30000 };

let cluster: Cluster;
const clients: Client[] = [];

before(async () => {
  cluster = await Cluster.start(3);
});
after(async () => {
  await Promise.allSettled(clients.map((c) => c.close()));
  await cluster?.stop();
});

async function connect(clientId: string, o: Partial<ClientOptions> = {}): Promise<Client> {
  const c = await Client.connect({ endpoints: cluster.endpoints, sessionTtlMs: 6000, clientId, ...o });
  clients.push(c);
  return c;
}

async function status(name: string): Promise<any> {
  const l = await cluster.leader();
  return (await getJSON(`${l.url}/api/v1/locks/${encodeURIComponent(name)}`)).body;
}

/** aborted resolves with the signal's reason once it aborts. */
function aborted(signal: AbortSignal): Promise<unknown> {
  if (signal.aborted) return Promise.resolve(signal.reason);
  return new Promise((r) => signal.addEventListener("abort", () => r(signal.reason), { once: true }));
}

/** take reads n changes of a watch, or fails after ms. */
async function take(it: AsyncIterator<WatchChange>, n: number, ms = 10000): Promise<WatchChange[]> {
  const out: WatchChange[] = [];
  const read = (async () => {
    while (out.length < n) {
      const r = await it.next();
      if (r.done) throw new Error(`the watch ended after ${out.length} of ${n} changes`);
      out.push(r.value);
    }
    return out;
  })();
  return within(read, ms, () => `${n} changes (got ${JSON.stringify(out.map((c) => [c.lock, String(c.index), c.status.held]))})`);
}

describe("locks", () => {
  test("acquire, tryAcquire naming the holder, release; tokens rise", T, async () => {
    const a = await connect("locks-a");
    const b = await connect("locks-b");
    const l = await a.acquire("basic/x");
    assert.equal(typeof l.fencingToken, "bigint");
    assert.equal(l.mode, "exclusive");
    assert.equal(l.signal.aborted, false);
    const e = await b.tryAcquire("basic/x").then(() => undefined, (e: unknown) => e);
    assert.ok(e instanceof LockHeldError, String(e));
    assert.equal(e.holder, "locks-a");
    assert.equal(e.lock, "basic/x");
    assert.equal(e.byThisClient, false);
    // The same client: held here, not handed out twice.
    const own = await a.tryAcquire("basic/x").then(() => undefined, (e: unknown) => e);
    assert.ok(own instanceof LockHeldError && own.byThisClient, String(own));
    const st = await status("basic/x");
    assert.equal(st.client_id, "locks-a");
    assert.equal(BigInt(st.fencing_token), l.fencingToken);
    await l.release();
    assert.ok(l.signal.reason instanceof ReleasedError);
    await l.release(); // again: nothing to do
    const l2 = await b.tryAcquire("basic/x");
    assert.ok(l2.fencingToken > l.fencingToken);
    await l2.release();
    assert.equal((await status("basic/x")).held, false);
  });

  test("given only a follower, the client follows not_leader (WebSocket) and 307 (HTTP) to the leader", T, async () => {
    const leader = await cluster.leader();
    const follower = cluster.members.find((m) => m !== leader)!;
    const c = await connect("follow-a", { endpoints: [follower.url] });
    assert.equal(c.current!.base, leader.url);
    const l = await c.acquire("follow/x");
    // The HTTP side on its own, before it knows the leader: a linearizable
    // read on the follower answers 307, followed to the leader it names.
    const http = new HttpApi(configure({ endpoints: [follower.url] }), new Trust([follower.url]));
    try {
      assert.equal(http.leader, "");
      const r = await http.call("GET", "/api/v1/locks/follow%2Fx");
      assert.equal(http.leader, leader.url);
      assert.match(r.text, new RegExp(`"fencing_token":${l.fencingToken}\\b`));
    } finally {
      http.close();
    }
    await l.release();
  });

  test("a grant is pushed to the waiter when the lock is released, in FIFO order", T, async () => {
    const a = await connect("push-a");
    const b = await connect("push-b");
    const c = await connect("push-c");
    const la = await a.acquire("push/x");
    const pb = b.acquire("push/x", { waitTimeoutMs: 10000 });
    await poll("b queued", 5000, async () => ((await status("push/x")).waiters === 1 ? true : undefined));
    const pc = c.acquire("push/x", { waitTimeoutMs: 10000 });
    await poll("c queued", 5000, async () => ((await status("push/x")).waiters === 2 ? true : undefined));
    const t0 = performance.now();
    await la.release();
    const lb = await pb;
    const took = since(t0);
    assert.ok(took < 1000, `the grant came ${took} ms after the release`);
    assert.ok(lb.fencingToken > la.fencingToken);
    let cDone = false;
    void pc.then(() => (cDone = true));
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(cDone, false, "c was granted while b holds the lock");
    await lb.release();
    const lc = await pc;
    assert.ok(lc.fencingToken > lb.fencingToken);
    await lc.release();
  });

  test("a wait that runs out rejects with WaitTimeoutError", T, async () => {
    const a = await connect("wt-a");
    const b = await connect("wt-b");
    const l = await a.acquire("wt/x");
    const t0 = performance.now();
    await assert.rejects(b.acquire("wt/x", { waitTimeoutMs: 500 }), WaitTimeoutError);
    const took = since(t0);
    assert.ok(took >= 450 && took < 2500, `took ${took} ms`);
    await l.release();
  });

  test("acquireMany: all or nothing, in name order; a refused try names the blocking lock and holder", T, async () => {
    const a = await connect("multi-a");
    const b = await connect("multi-b");
    const ls = await a.acquireMany(["multi/b", "multi/a"]);
    assert.deepEqual(ls.map((l) => l.name), ["multi/a", "multi/b"]);
    assert.notEqual(ls[0]!.fencingToken, ls[1]!.fencingToken);
    const e = await b.tryAcquireMany(["multi/c", "multi/b"]).then(() => undefined, (e: unknown) => e);
    assert.ok(e instanceof LockHeldError, String(e));
    assert.equal(e.lock, "multi/b");
    assert.equal(e.holder, "multi-a");
    assert.equal((await status("multi/c")).held, false, "a refused multi-acquire took a lock");
    // Waiting: granted when both are free, in one step.
    const pb = b.acquireMany(["multi/a", "multi/b"], { waitTimeoutMs: 10000 });
    await ls[0]!.release();
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await status("multi/a")).held, false, "multi/a granted alone");
    await ls[1]!.release();
    const lb = await pb;
    assert.deepEqual(lb.map((l) => l.name), ["multi/a", "multi/b"]);
    // One fate: revoking one loses both.
    await b.revoke("multi/a");
    assert.ok((await aborted(lb[0]!.signal)) instanceof RevokedError);
    assert.ok((await aborted(lb[1]!.signal)) instanceof RevokedError);
    await poll("multi/b released in the background", 5000, async () => ((await status("multi/b")).held ? undefined : true));
  });

  test("shared holders coexist; an exclusive waits for them; readers queue behind a waiting writer", T, async () => {
    const r1 = await connect("rw-r1");
    const r2 = await connect("rw-r2");
    const w = await connect("rw-w");
    const s1 = await r1.acquire("rw/x", { mode: "shared" });
    const s2 = await r2.acquire("rw/x", { mode: "shared" });
    assert.equal(s1.mode, "shared");
    assert.equal(s2.mode, "shared");
    await assert.rejects(w.tryAcquire("rw/x"), LockHeldError);
    const pw = w.acquire("rw/x", { waitTimeoutMs: 10000 });
    await poll("writer queued", 5000, async () => ((await status("rw/x")).waiters === 1 ? true : undefined));
    await s1.release();
    await s2.release();
    const lw = await pw;
    assert.equal(lw.mode, "exclusive");
    await lw.release();
  });

  test("a semaphore of 2: two hold, the third waits; another limit is a LimitMismatchError", T, async () => {
    const cs = await Promise.all([connect("sem-1"), connect("sem-2"), connect("sem-3")]);
    const l1 = await cs[0]!.acquire("sem/x", { limit: 2 });
    const l2 = await cs[1]!.acquire("sem/x", { limit: 2 });
    assert.notEqual(l1.fencingToken, l2.fencingToken);
    await assert.rejects(cs[2]!.tryAcquire("sem/x", { limit: 3 }), LimitMismatchError);
    await assert.rejects(cs[2]!.tryAcquire("sem/x"), LockHeldError);
    const p3 = cs[2]!.acquire("sem/x", { waitTimeoutMs: 10000 });
    const st = await status("sem/x");
    assert.equal(st.limit, 2);
    assert.equal(st.holders.length, 2);
    await l1.release();
    const l3 = await p3;
    assert.ok(l3.fencingToken > l2.fencingToken);
    await l2.release();
    await l3.release();
  });

  test("values: set at acquire, changed by setValue, shown in the status", T, async () => {
    const a = await connect("val-a");
    const l = await a.acquire("val/x", { value: "v1" });
    assert.equal((await status("val/x")).value, "v1");
    await l.setValue("v2");
    assert.equal(l.value, "v2");
    assert.equal((await status("val/x")).value, "v2");
    await l.release();
  });
});

describe("loss signals", () => {
  test("a lock's own TTL: the signal aborts before the server expires it; autoRenew keeps it", T, async () => {
    const a = await connect("ttl-a");
    const t0 = performance.now();
    const l = await a.acquire("ttl/x", { ttlMs: 2000 });
    const serverExpiry = l.expiresAt;
    assert.ok(serverExpiry instanceof Date);
    const reason = await aborted(l.signal);
    const lostAt = Date.now();
    const took = since(t0);
    // The local lease ends at the acquire's send time + TTL - margin (102
    // ms of 2 s): before the expiry the server reported (one machine, one
    // clock), which it counts from when it committed the grant.
    assert.ok(reason instanceof LeaseExpiredError || reason instanceof LockExpiredError, String(reason));
    assert.ok(lostAt < serverExpiry.getTime(), `lost at ${new Date(lostAt).toISOString()}, after the server's expiry ${serverExpiry.toISOString()}`);
    assert.ok(took > 1600, `lost after ${took} ms: too early`);
    await poll("the server expired it", 3000, async () => ((await status("ttl/x")).held ? undefined : true));

    const r = await a.acquire("ttl/y", { ttlMs: 600, autoRenew: true });
    await new Promise((res) => setTimeout(res, 1800));
    assert.equal(r.signal.aborted, false, `lost: ${r.signal.reason}`);
    const st = await status("ttl/y");
    assert.equal(BigInt(st.fencing_token), r.fencingToken);
    await r.release();
  });

  test("revocation aborts the holder's signal with a RevokedError and hands the lock on", T, async () => {
    const a = await connect("rev-a");
    const b = await connect("rev-b");
    const l = await a.acquire("rev/x");
    const pb = b.acquire("rev/x", { waitTimeoutMs: 10000 });
    await poll("b queued", 5000, async () => ((await status("rev/x")).waiters === 1 ? true : undefined));
    const revoked = await b.revoke("rev/x");
    assert.deepEqual(revoked, [l.fencingToken]);
    const reason = await aborted(l.signal);
    assert.ok(reason instanceof RevokedError, String(reason));
    const lb = await pb;
    assert.ok(lb.fencingToken > l.fencingToken);
    await assert.rejects(l.release(), RevokedError);
    await lb.release();
  });

  test("withLock runs fn with the token and releases; a loss during fn aborts its signal and rejects", T, async () => {
    const a = await connect("with-a");
    const out = await a.withLock("with/x", async (signal, token, lock) => {
      assert.equal(signal.aborted, false);
      assert.equal(token, lock.fencingToken);
      assert.equal((await status("with/x")).client_id, "with-a");
      return "done";
    });
    assert.equal(out, "done");
    assert.equal((await status("with/x")).held, false);
    const err = await a
      .withLock("with/y", async (signal) => {
        await a.revoke("with/y");
        await aborted(signal);
        return "late";
      })
      .then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof RevokedError, String(err));
  });

  test("aborting an acquire rejects with the signal's reason and withdraws the queued wait (cancel)", T, async () => {
    const a = await connect("cancel-a");
    const b = await connect("cancel-b");
    const l = await a.acquire("cancel/x");
    const ac = new AbortController();
    const pb = b.acquire("cancel/x", { waitTimeoutMs: 30000, signal: ac.signal });
    await poll("b queued", 5000, async () => ((await status("cancel/x")).waiters === 1 ? true : undefined));
    const why = new Error("no longer needed");
    ac.abort(why);
    await assert.rejects(pb, (e: unknown) => e === why);
    // The wait is withdrawn on the server: no waiter left, and the release
    // hands the lock to nobody.
    await poll("the wait withdrawn", 3000, async () => ((await status("cancel/x")).waiters === 0 ? true : undefined));
    await l.release();
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await status("cancel/x")).held, false);
    // A new acquire of the name works at once.
    const again = await b.acquire("cancel/x", { waitTimeoutMs: 5000 });
    await again.release();
    void CancelledError;
  });

  test("a grant that races an abort is released, never leaked", T, async () => {
    const a = await connect("race-a");
    const b = await connect("race-b");
    for (let i = 0; i < 5; i++) {
      const l = await a.acquire("race/x");
      const ac = new AbortController();
      const pb = b.acquire("race/x", { waitTimeoutMs: 10000, signal: ac.signal }).catch(() => undefined);
      await poll("b queued", 5000, async () => ((await status("race/x")).waiters === 1 ? true : undefined));
      const rel = l.release();
      ac.abort(new Error("gone"));
      await rel;
      await pb;
      await poll("race/x free", 5000, async () => {
        const st = await status("race/x");
        return !st.held && st.waiters === 0 ? true : undefined;
      });
    }
  });
});

describe("after a reconnect", () => {
  test("the check of held locks finds its grant among more holders than a status lists (holders_total, paging)", T, async () => {
    const leader = await cluster.leader();
    // 65 holders of a semaphore of 70 by plain HTTP, each its own client.
    for (let i = 0; i < 65; i++) {
      const r = await fetch(`${leader.url}/api/v1/locks/many%2Fsem/acquire`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ client_id: `http-${i}`, ttl_ms: 60000, limit: 70 }),
      });
      assert.equal(r.status, 200, await r.text());
    }
    const proxy = await Proxy.start(leader.httpPort);
    try {
      const c = await connect("many-c", { endpoints: [proxy.url], sessionTtlMs: 10000 });
      const l = await c.acquire("many/sem", { limit: 70 });
      const st = await c.status("many/sem");
      assert.equal(st.holdersTotal, 66);
      assert.ok(st.holders.length < 66 && !st.holders.some((h) => h.fencingToken === l.fencingToken), "the status lists every holder: nothing to page");
      const before = c.current;
      proxy.cut();
      await new Promise((r) => setTimeout(r, 300));
      proxy.heal();
      await poll("the session resumed", 10000, () => (c.current && c.current !== before ? true : undefined));
      await new Promise((r) => setTimeout(r, 500)); // the check after the resume
      assert.equal(l.signal.aborted, false, `lost: ${l.signal.reason}`);
      await l.release();
    } finally {
      await proxy.close();
    }
  });
});

describe("elections", () => {
  test("two candidates and an observer: leaders in campaign order, proclamations, resign hands over", T, async () => {
    const c1 = await connect("el-1");
    const c2 = await connect("el-2");
    const obs = await connect("el-obs");
    const e1 = c1.election("el/leader");
    const e2 = c2.election("el/leader");
    const eo = obs.election("el/leader");
    await assert.rejects(eo.leader(), ElectionNoLeaderError);
    await assert.rejects(e1.proclaim("x"), ElectionNotLeaderError);
    assert.equal(e1.signal.aborted, true);
    const seen: string[] = [];
    const ac = new AbortController();
    const observed = (async () => {
      for await (const li of eo.observe({ signal: ac.signal })) {
        seen.push(`${li.clientId}=${li.value}`);
        if (seen.length === 3) break;
      }
    })();
    await e1.campaign("host-1");
    assert.equal(e1.leading, true);
    const p2 = e2.campaign("host-2");
    await poll("candidate 2 queued", 5000, async () => ((await status("el/leader")).waiters === 1 ? true : undefined));
    await e1.proclaim("host-1b");
    const li = await eo.leader();
    assert.equal(li.clientId, "el-1");
    assert.equal(li.value, "host-1b");
    assert.equal(li.fencingToken, e1.fencingToken);
    const first = e1.signal;
    await e1.resign();
    assert.ok(first.reason instanceof ReleasedError);
    await p2;
    assert.equal(e2.leading, true);
    assert.ok(e2.fencingToken! > e1.fencingToken!);
    await observed;
    assert.deepEqual(seen, ["el-1=host-1", "el-1=host-1b", "el-2=host-2"]);
    assert.equal((await eo.leader()).clientId, "el-2");
    await e2.resign();
  });
});

describe("watches", () => {
  test("a prefix watch: the first picture, each change in log order, and the state after a reconnect", T, async () => {
    const a = await connect("watch-a");
    // The watcher reaches the leader through a proxy the test can cut.
    const leader = await cluster.leader();
    const proxy = await Proxy.start(leader.httpPort);
    try {
      const w = await connect("watch-w", { endpoints: [proxy.url], sessionTtlMs: 10000 });
      const l1 = await a.acquire("watched/1");
      const l2 = await a.acquire("watched/2");
      const it = w.watch({ prefix: "watched/" });
      await within(it.ready, 5000, "the watch accepted");
      const firstPicture = await take(it, 2);
      assert.deepEqual(firstPicture.map((c) => c.lock).sort(), ["watched/1", "watched/2"]);
      assert.ok(firstPicture.every((c) => c.status.held && !c.resync));
      await within(it.synced, 5000, "the synced frame that ends a watch's first picture");
      // A change comes as it commits.
      await l2.setValue("v");
      const [ch] = await take(it, 1);
      assert.equal(ch!.lock, "watched/2");
      assert.equal(ch!.status.value, "v");
      assert.ok(ch!.index > firstPicture.find((c) => c.lock === "watched/2")!.index);

      // Away: watched/1 freed, watched/2 changed, watched/3 taken.
      proxy.cut();
      await new Promise((r) => setTimeout(r, 300));
      await l1.release();
      await l2.setValue("w");
      const l3 = await a.acquire("watched/3");
      await new Promise((r) => setTimeout(r, 300));
      proxy.heal();
      const after = await take(it, 3, 15000);
      const byLock = new Map(after.map((c) => [c.lock, c]));
      assert.deepEqual([...byLock.keys()].sort(), ["watched/1", "watched/2", "watched/3"], JSON.stringify(after.map((c) => c.lock)));
      assert.equal(byLock.get("watched/1")!.status.held, false, "the lock freed while away did not come as free");
      assert.equal(byLock.get("watched/2")!.status.value, "w");
      assert.equal(byLock.get("watched/3")!.status.holders[0]!.fencingToken, l3.fencingToken);
      assert.ok(after.every((c) => c.resync), "re-read changes are marked resync");
      // And on from there.
      await l3.release();
      const [last] = await take(it, 1);
      assert.equal(last!.lock, "watched/3");
      assert.equal(last!.status.held, false);
      await it.return();
      await l2.release();
    } finally {
      await proxy.close();
    }
  });

  test("a single lock's watch starts with its state, free or not, and ends with its signal", T, async () => {
    const a = await connect("watch1-a");
    const ac = new AbortController();
    const it = a.watch({ lock: "watch1/x", signal: ac.signal });
    const [first] = await take(it, 1);
    assert.equal(first!.status.held, false);
    const l: Lock = await a.acquire("watch1/x");
    const [second] = await take(it, 1);
    assert.equal(second!.status.holders[0]!.fencingToken, l.fencingToken);
    ac.abort();
    const r = await it.next();
    assert.equal(r.done, true);
    await l.release();
  });
});
