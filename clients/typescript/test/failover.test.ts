// The client through leader failures of a real 3-member cluster: connect
// while there is no leader yet, kill -9 of the leader while holding (the
// lock survives, and keeps fencing writes) and while waiting (the wait
// survives, keeps its place, and is granted later), and a watch that
// follows the cluster across the leader change.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, type ClientOptions, type WatchChange } from "../src/index.js";
import { Cluster, type Member, fencedPut, getJSON, poll, startFencestore, stopProcess, within } from "./harness.js";
import type { ChildProcess } from "node:child_process";

const T = { timeout: 60000 };

let cluster: Cluster;
let fencestore: { url: string; proc: ChildProcess };
const clients: Client[] = [];

before(async () => {
  fencestore = await startFencestore();
});
after(async () => {
  await Promise.allSettled(clients.map((c) => c.close()));
  await cluster?.stop();
  if (fencestore) await stopProcess(fencestore.proc);
});

async function connect(clientId: string, o: Partial<ClientOptions> = {}): Promise<Client> {
  const c = await Client.connect({ endpoints: cluster.endpoints, sessionTtlMs: 8000, clientId, ...o });
  clients.push(c);
  return c;
}

async function status(name: string): Promise<any> {
  const l = await cluster.leader();
  return (await getJSON(`${l.url}/api/v1/locks/${encodeURIComponent(name)}`)).body;
}

/** failover kills the leader with SIGKILL, waits for a new one, and returns the old. */
async function failover(): Promise<Member> {
  const old = await cluster.leader();
  await old.kill9();
  const l = await cluster.leader(15000);
  assert.notEqual(l.id, old.id);
  return old;
}

test("connect waits while there is no leader and tries every endpoint", T, async () => {
  // One member of three cannot elect a leader: connect keeps trying (the
  // others refuse connections, the one up has no leader) until the others
  // start.
  cluster = await Cluster.startStopped(3);
  cluster.members[0]!.start();
  const t0 = performance.now();
  const pending = Client.connect({ endpoints: cluster.endpoints, sessionTtlMs: 8000, clientId: "early", dialTimeoutMs: 20000 });
  let done = false;
  void pending.then(() => (done = true), () => (done = true));
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(done, false, "connect resolved without a leader");
  cluster.members[1]!.start();
  cluster.members[2]!.start();
  const c = await pending;
  clients.push(c);
  assert.ok(performance.now() - t0 >= 1500);
  await cluster.ready();
  const l = await c.acquire("early/x");
  await l.release();
});

test("kill -9 of the leader while holding: the lock survives with its token and keeps fencing writes", T, async () => {
  const a = await connect("hold-a");
  const l = await a.acquire("fo/held");
  const w1 = await fencedPut(fencestore.url, "fo/key", "one", l.fencingHeaders());
  assert.equal(w1.status, 200, JSON.stringify(w1.body));
  const old = await failover();
  // The session resumes on the new leader: the lock is still held, the
  // client never thought it lost.
  await poll("the client back on the new leader", 10000, () => (a.current && a.current.base !== old.url ? true : undefined));
  const st = await status("fo/held");
  assert.equal(st.client_id, "hold-a");
  assert.equal(BigInt(st.fencing_token), l.fencingToken);
  await new Promise((r) => setTimeout(r, 1000)); // the check after the resume, and a keepalive
  assert.equal(l.signal.aborted, false, `lost: ${l.signal.reason}`);
  const w2 = await fencedPut(fencestore.url, "fo/key", "two", l.fencingHeaders());
  assert.equal(w2.status, 200, JSON.stringify(w2.body));
  await l.release();
  // A later holder's token is higher; the old one is refused from then on.
  const b = await connect("hold-b");
  const lb = await b.acquire("fo/held");
  assert.ok(lb.fencingToken > l.fencingToken);
  assert.equal((await fencedPut(fencestore.url, "fo/key", "three", lb.fencingHeaders())).status, 200);
  const stale = await fencedPut(fencestore.url, "fo/key", "stale", l.fencingHeaders());
  assert.equal(stale.status, 409);
  assert.equal(stale.body.error.code, "stale_token");
  await lb.release();
  await cluster.restart(old);
});

test("kill -9 of the leader while waiting: the wait survives, keeps its place, and is granted", T, async () => {
  const holder = await connect("wait-holder");
  const a = await connect("wait-a");
  const c = await connect("wait-c");
  const lh = await holder.acquire("fo/wait");
  const pa = a.acquire("fo/wait", { waitTimeoutMs: 30000 });
  await poll("a queued", 5000, async () => ((await status("fo/wait")).waiters === 1 ? true : undefined));
  const pc = c.acquire("fo/wait", { waitTimeoutMs: 30000 });
  await poll("c queued", 5000, async () => ((await status("fo/wait")).waiters === 2 ? true : undefined));
  const old = await failover();
  await poll("the waiters back on the new leader", 10000, () => (a.current && c.current && holder.current && a.current.base !== old.url && c.current.base !== old.url && holder.current.base !== old.url ? true : undefined));
  const st = await status("fo/wait");
  assert.equal(st.waiters, 2, JSON.stringify(st));
  await lh.release();
  const la = await pa;
  assert.ok(la.fencingToken > lh.fencingToken);
  let cDone = false;
  void pc.then(() => (cDone = true));
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(cDone, false, "c was granted before a released: the wait lost its place");
  await la.release();
  const lc = await pc;
  assert.ok(lc.fencingToken > la.fencingToken);
  await lc.release();
  await cluster.restart(old);
});

test("a watch follows the cluster across a leader change", T, async () => {
  const a = await connect("fw-a");
  const w = await connect("fw-w");
  const it = w.watch({ lock: "fo/watched" });
  const next = () => within(it.next(), 10000, "a change").then((r) => r.value as WatchChange);
  const first = await next();
  assert.equal(first.status.held, false);
  const l1 = await a.acquire("fo/watched");
  const second = await next();
  assert.equal(second.status.holders[0]!.fencingToken, l1.fencingToken);
  const old = await failover();
  await l1.release(); // on the new leader
  // The release comes, pushed or read again after the reconnect; nothing
  // older, nothing twice.
  const third = await next();
  assert.equal(third.status.held, false);
  assert.ok(third.index > second.index);
  const l2 = await a.acquire("fo/watched");
  const fourth = await next();
  assert.equal(fourth.status.holders[0]!.fencingToken, l2.fencingToken);
  assert.ok(fourth.index > third.index);
  await l2.release();
  await it.return();
  await cluster.restart(old);
});


