// The Node example of the repository's README, copied as a user would, runs
// against a 3-member cluster and a fencestore (their ports put in for the
// README's), and its fenced write lands with the lock's token.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, test } from "node:test";
import type { ChildProcess } from "node:child_process";
import { Cluster, packageRoot, repoRoot, startFencestore, stopProcess } from "./harness.js";

let cluster: Cluster | undefined;
let fs: { url: string; proc: ChildProcess } | undefined;
after(async () => {
  await cluster?.stop();
  if (fs) await stopProcess(fs.proc);
});

test("the README's Node example runs as written", { timeout: 60000 }, async () => {
  const readme = readFileSync(join(repoRoot, "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("## Node client"));
  const m = /```js\n([\s\S]*?)```/.exec(section);
  assert.ok(m, "no ```js block in the README's Node client section");
  let code = m[1]!;
  cluster = await Cluster.start(3);
  fs = await startFencestore();
  const ports: Record<string, string> = {
    "127.0.0.1:7070": cluster.endpoints[0]!.replace("http://", ""),
    "127.0.0.1:7170": cluster.endpoints[1]!.replace("http://", ""),
    "127.0.0.1:7270": cluster.endpoints[2]!.replace("http://", ""),
    "127.0.0.1:7090": fs.url.replace("http://", ""),
  };
  for (const [from, to] of Object.entries(ports)) {
    assert.ok(code.includes(from), `the example no longer names ${from}`);
    code = code.replaceAll(from, to);
  }
  // Inside the package, so that "@lockd/client" resolves to it (a package
  // may import itself by name) as it does where it is installed.
  const file = join(packageRoot, "build", "readme-example.mjs");
  writeFileSync(file, code);
  const r = await promisify(execFile)(process.execPath, [file], { timeout: 30000 }).catch((e: { stdout: string; stderr: string; code: number }) => e);
  assert.equal((r as { code?: number }).code ?? 0, 0, `the example failed: ${(r as { stderr: string }).stderr}`);
  const got = await fetch(`${fs.url}/v1/objects/report`);
  assert.equal(got.status, 200);
  const token = got.headers.get("fencing-token");
  assert.match(token ?? "", /^\d+$/);
  assert.equal(await got.text(), `report written under token ${token}`);
  // close() ended the session: the lock is free.
  const leader = await cluster.leader();
  const st = (await (await fetch(`${leader.url}/api/v1/locks/nightly-report`)).json()) as { held: boolean };
  assert.equal(st.held, false);
});

test("the shipped types (dist/*.d.ts) compile in a strict consumer", { timeout: 60000 }, async () => {
  // The API as a user writes it, checked against what the package ships
  // (through its exports, as an installed package), not against src/.
  const dir = join(packageRoot, "build", "types-consumer");
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, "consumer.ts"),
    `import { Client, LockHeldError, RevokedError, type Lock, type WatchChange, type LeaderInfo } from "@lockd/client";
const c = await Client.connect({ endpoints: ["http://127.0.0.1:7070"], sessionTtlMs: 15000, tls: { ca: "" }, token: "t" });
const lock: Lock = await c.acquire("jobs/nightly", { waitTimeoutMs: 5000, ttlMs: 30000, mode: "shared", limit: 1, value: "v", lockDelayMs: 0, autoRenew: true });
const token: bigint = lock.fencingToken;
const signal: AbortSignal = lock.signal;
if (signal.reason instanceof RevokedError) console.log(signal.reason.code);
await lock.release();
const n: number = await c.withLock("jobs/nightly", async (s: AbortSignal, t: bigint) => (s.aborted ? 0 : Number(t)), { waitTimeoutMs: 60000 });
try { await c.tryAcquire("x"); } catch (e) { if (e instanceof LockHeldError) console.log(e.holder, e.byThisClient); }
const many: Lock[] = await c.acquireMany(["a", "b"]);
const e = c.election("leader");
await e.campaign("host-a", { signal });
await e.proclaim("v2");
await e.resign();
for await (const li of e.observe({ signal })) { const x: LeaderInfo = li; console.log(x.value, x.fencingToken); }
for await (const ch of c.watch({ prefix: "jobs/" })) { const x: WatchChange = ch; console.log(x.lock, x.index, x.status.holdersTotal); }
const revoked: bigint[] = await c.revoke("x", token);
await c.close();
void n; void many; void revoked;
`,
  );
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true, types: ["node"], skipLibCheck: false, typeRoots: [join(packageRoot, "node_modules", "@types")] },
      files: ["consumer.ts"],
    }),
  );
  const tsc = join(packageRoot, "node_modules", "typescript", "bin", "tsc");
  const r = await promisify(execFile)(process.execPath, [tsc, "-p", dir], { timeout: 50000 }).catch((e: { stdout: string; code: number }) => e);
  assert.equal((r as { code?: number }).code ?? 0, 0, `the consumer does not compile:\n${(r as { stdout: string }).stdout}`);
});
