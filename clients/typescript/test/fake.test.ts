// The client against a scripted member (fake.ts), for the answers a real
// cluster gives only under load or faults: overloaded refusals with a retry
// hint (WebSocket) or Retry-After (HTTP, upgrade), the withdrawal of an
// aborted acquire, redirects outside the cluster, and a watch's first
// picture after a reconnect that lacks a lock freed meanwhile.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Client, type ClientOptions, UntrustedRedirectError } from "../src/index.js";
import { FakeMember } from "./fake.js";
import { poll, within } from "./harness.js";

const T = { timeout: 20000 };
const closers: Array<() => Promise<unknown>> = [];
after(async () => {
  for (const c of closers.reverse()) await c().catch(() => {});
});

async function fake(h: Parameters<typeof FakeMember.start>[0]): Promise<FakeMember> {
  const m = await FakeMember.start(h);
  closers.push(() => m.close());
  return m;
}

async function connect(o: ClientOptions): Promise<Client> {
  const c = await Client.connect({ closeTimeoutMs: 500, ...o });
  closers.push(() => c.close());
  return c;
}

const grant = (id: number, lock: string, token: bigint | number) => `{"id":${id},"type":"granted","lock":"${lock}","fencing_token":${token},"mode":"exclusive"}`;

test("an acquire refused as overloaded is sent again after the frame's retry hint", T, async () => {
  let refused = 0;
  const m = await fake({
    frame(conn, f) {
      if (f.op === "acquire" && refused < 2) {
        refused++;
        conn.send({ id: f.id, type: "error", lock: f.lock, error: { code: "overloaded", message: "busy" }, retry_after_ms: 300 });
      } else if (f.op === "acquire") {
        conn.sendRaw(grant(f.id, f.lock, (1n << 64n) - 1n));
      } else if (f.op === "release") {
        conn.send({ id: f.id, type: "ok", lock: f.lock, fencing_token: 1 });
      }
    },
  });
  const c = await connect({ endpoints: [m.url], clientId: "ov" });
  const l = await c.acquire("x", { waitTimeoutMs: 5000 });
  assert.equal(l.fencingToken, (1n << 64n) - 1n);
  const sends = m.frames("acquire");
  assert.equal(sends.length, 3);
  assert.ok(sends[1]!.t - sends[0]!.t >= 290, `resent after ${sends[1]!.t - sends[0]!.t} ms`);
  assert.ok(sends[2]!.t - sends[1]!.t >= 290, `resent after ${sends[2]!.t - sends[1]!.t} ms`);
  // The resend keeps the wait's deadline: what is left of it, not more.
  assert.ok(sends[2]!.f.wait_timeout_ms < sends[0]!.f.wait_timeout_ms);
});

test("a release refused as overloaded is retried on the same connection", T, async () => {
  let refused = false;
  const m = await fake({
    frame(conn, f) {
      if (f.op === "acquire") conn.sendRaw(grant(f.id, f.lock, 7));
      if (f.op === "release" && !refused) {
        refused = true;
        conn.send({ id: f.id, type: "error", error: { code: "overloaded", message: "busy" }, retry_after_ms: 200 });
      } else if (f.op === "release") conn.send({ id: f.id, type: "ok", lock: f.lock, fencing_token: 7 });
    },
  });
  const c = await connect({ endpoints: [m.url], clientId: "ovr" });
  const l = await c.acquire("x");
  await l.release();
  assert.equal(m.frames("release").length, 2);
  assert.equal(m.conns.length, 1);
});

test("HTTP 503 overloaded with Retry-After is retried after it", T, async () => {
  let calls = 0;
  const times: number[] = [];
  const m = await fake({
    http(req, res) {
      times.push(performance.now());
      if (req.url?.startsWith("/api/v1/locks/x") && calls++ === 0) {
        res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "1" }).end(JSON.stringify({ error: { code: "overloaded", message: "busy" } }));
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" }).end(`{"lock":"x","held":true,"waiters":0,"mode":"exclusive","limit":1,"index":12,"holders":[{"client_id":"h","fencing_token":18446744073709551615,"mode":"exclusive"}],"holders_total":1}`);
    },
  });
  const c = await connect({ endpoints: [m.url], clientId: "ovh" });
  const st = await c.status("x");
  assert.equal(st.holders[0]!.fencingToken, (1n << 64n) - 1n);
  assert.equal(times.length, 2);
  assert.ok(times[1]! - times[0]! >= 990, `retried after ${times[1]! - times[0]!} ms`);
});

test("a WebSocket upgrade refused with 503 and Retry-After is tried again after it", T, async () => {
  let refusals = 0;
  const m = await fake({
    upgrade(_req, res) {
      if (refusals++ > 0) return true;
      res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "1" }).end(JSON.stringify({ error: { code: "no_leader", message: "no leader yet" } }));
      return false;
    },
  });
  const t0 = performance.now();
  await connect({ endpoints: [m.url], clientId: "up" });
  assert.ok(performance.now() - t0 >= 950, `connected after ${performance.now() - t0} ms`);
});

test("an aborted acquire sends cancel (lock, or locks for a multi-acquire) and rejects with the signal's reason", T, async () => {
  const m = await fake({
    frame(conn, f) {
      if (f.op === "cancel") {
        // Withdrawn: the acquire is answered cancelled, the cancel ok.
        const acq = conn.received.filter((x) => x.op === "acquire" && (x.lock === f.lock || JSON.stringify(x.locks) === JSON.stringify(f.locks))).at(-1)!;
        conn.send({ id: acq.id, type: "error", lock: f.lock ?? f.locks[0], error: { code: "cancelled", message: "withdrawn" } });
        conn.send({ id: f.id, type: "ok", cancelled: true });
      }
    },
  });
  const c = await connect({ endpoints: [m.url], clientId: "cx" });
  const ac = new AbortController();
  const p = c.acquire("q", { signal: ac.signal, waitTimeoutMs: 10000 });
  await poll("acquire sent", 2000, () => (m.frames("acquire").length === 1 ? true : undefined));
  const why = new Error("stop");
  ac.abort(why);
  await assert.rejects(p, (e: unknown) => e === why);
  await poll("cancel sent", 2000, () => (m.frames("cancel").length === 1 ? true : undefined));
  assert.deepEqual(m.frames("cancel")[0]!.f, { id: m.frames("cancel")[0]!.f.id, op: "cancel", lock: "q" });

  const ac2 = new AbortController();
  const p2 = c.acquireMany(["b", "a"], { signal: ac2.signal });
  await poll("multi-acquire sent", 2000, () => (m.frames("acquire").length === 2 ? true : undefined));
  ac2.abort(new Error("stop too"));
  await assert.rejects(p2, /stop too/);
  await poll("cancel of the multi-acquire sent", 2000, () => (m.frames("cancel").length === 2 ? true : undefined));
  assert.deepEqual(m.frames("cancel")[1]!.f.locks, ["a", "b"]);

  // An acquire of the name after the withdrawal starts afresh.
  const p3 = c.acquire("q", { waitTimeoutMs: 10000 });
  await poll("the new acquire sent", 2000, () => (m.frames("acquire").length === 3 ? true : undefined));
  const a3 = m.frames("acquire")[2]!.f;
  m.conns[0]!.sendRaw(grant(a3.id, "q", 9));
  assert.equal((await p3).fencingToken, 9n);
});

test("a grant that comes after the abort is released", T, async () => {
  const m = await fake({
    frame(conn, f) {
      if (f.op === "cancel") {
        // Too late: the wait was granted already.
        const acq = conn.received.filter((x) => x.op === "acquire").at(-1)!;
        conn.sendRaw(grant(acq.id, "g", 11));
        conn.send({ id: f.id, type: "ok", cancelled: false });
      }
      if (f.op === "release") conn.send({ id: f.id, type: "ok", lock: f.lock, fencing_token: 11 });
    },
  });
  const c = await connect({ endpoints: [m.url], clientId: "late" });
  const ac = new AbortController();
  const p = c.acquire("g", { signal: ac.signal });
  await poll("acquire sent", 2000, () => (m.frames("acquire").length === 1 ? true : undefined));
  ac.abort(new Error("stop"));
  await assert.rejects(p, /stop/);
  await poll("the late grant released", 2000, () => (m.frames("release").some((x) => x.f.lock === "g" && x.f.fencing_token === 11) ? true : undefined));
});

test("a configured endpoint that redirects outside the cluster fails connect at once", T, async () => {
  const m = await fake({
    upgrade(_req, res) {
      res.writeHead(307, { Location: "http://198.51.100.7:7070/api/v1/ws" }).end();
      return false;
    },
  });
  const t0 = performance.now();
  await assert.rejects(Client.connect({ endpoints: [m.url], dialTimeoutMs: 5000 }), UntrustedRedirectError);
  assert.ok(performance.now() - t0 < 2000);
});

test("a prefix watch after a reconnect: a lock missing from the new first picture comes as free, at the synced index", T, async () => {
  let round = 0;
  const status = (lock: string, index: number, holder?: string) =>
    holder
      ? { lock, held: true, waiters: 0, mode: "exclusive", limit: 1, index, holders: [{ client_id: holder, fencing_token: index, mode: "exclusive" }], holders_total: 1 }
      : { lock, held: false, waiters: 0, mode: "none", limit: 1, index, holders_total: 0 };
  const m = await fake({
    frame(conn, f) {
      if (f.op !== "watch") return;
      round++;
      conn.send({ id: f.id, type: "ok", watch_id: 5 });
      if (round === 1) {
        conn.send({ type: "changed", watch_id: 5, lock: "p/a", index: 10, status: status("p/a", 10, "h") });
        conn.send({ type: "changed", watch_id: 5, lock: "p/b", index: 11, status: status("p/b", 11, "h") });
        conn.send({ type: "synced", watch_id: 5, index: 12 });
        conn.send({ type: "changed", watch_id: 5, lock: "p/b", index: 13, status: status("p/b", 13, "h2") });
      } else {
        // After the reconnect: p/a was freed meanwhile (no state, so not in
        // the picture), p/b's state is the one already seen (not again),
        // p/c is new.
        conn.send({ type: "changed", watch_id: 5, lock: "p/b", index: 13, status: status("p/b", 13, "h2") });
        conn.send({ type: "changed", watch_id: 5, lock: "p/c", index: 20, status: status("p/c", 20, "h3") });
        conn.send({ type: "synced", watch_id: 5, index: 25 });
        conn.send({ type: "changed", watch_id: 5, lock: "p/c", index: 26, status: status("p/c", 26) });
      }
    },
  });
  const c = await connect({ endpoints: [m.url], clientId: "w" });
  const it = c.watch({ prefix: "p/" });
  const seen: string[] = [];
  const take = async (n: number) => {
    for (let i = 0; i < n; i++) {
      const r = await within(it.next(), 5000, `change ${seen.length + 1} (seen ${seen})`);
      const ch = r.value!;
      seen.push(`${ch.lock}@${ch.index}:${ch.status.held ? ch.status.holders[0]!.clientId : "free"}${ch.resync ? ":resync" : ""}`);
    }
  };
  await take(3);
  assert.equal(await it.synced, 12n);
  m.conns[0]!.drop();
  await take(3);
  assert.deepEqual(seen, ["p/a@10:h", "p/b@11:h", "p/b@13:h2", "p/c@20:h3:resync", "p/a@25:free:resync", "p/c@26:free"]);
  // The new watch resumed the session and asked for the same prefix.
  assert.equal(m.conns.length, 2);
  assert.equal(m.conns[1]!.received[0]!.session_id, m.conns[0]!.sessionId);
  assert.deepEqual(m.frames("watch").map((x) => x.f.prefix), ["p/", "p/"]);
});
