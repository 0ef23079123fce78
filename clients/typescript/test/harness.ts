// Test harness: builds lockd, lockctl and fencestore from this repository,
// runs real members on free loopback ports, and stops them. Members log to
// files in a temporary directory that is removed when the test file passes
// and kept (and named) when it fails.

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** The package's root (clients/typescript), from build/test/. */
export const packageRoot = resolve(here, "../..");
/** The repository's root, where go.mod is. */
export const repoRoot = resolve(packageRoot, "../..");

const binDir = join(packageRoot, "build", "bin");
const names = ["lockd", "lockctl", "fencestore"] as const;
type Binary = (typeof names)[number];

/** buildBinaries builds every binary into build/bin (go build is cached). */
export function buildBinaries(): void {
  if (!existsSync(join(repoRoot, "go.mod"))) throw new Error(`no go.mod in ${repoRoot}`);
  mkdirSync(binDir, { recursive: true });
  for (const n of names) {
    if (process.env[`${n.toUpperCase()}_BIN`]) continue;
    execFileSync("go", ["build", "-o", join(binDir, n), `./cmd/${n}`], { cwd: repoRoot, stdio: "inherit" });
  }
}

/** bin is the path of a binary: <NAME>_BIN from the environment, or build/bin (built when missing). */
export function bin(name: Binary): string {
  const ov = process.env[`${name.toUpperCase()}_BIN`];
  if (ov) return ov;
  const p = join(binDir, name);
  if (!existsSync(p)) buildBinaries();
  return p;
}

/** freePort returns a TCP port on 127.0.0.1 that was free a moment ago. */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => res(p));
    });
  });
}

/** The test's temporary directory: logs and data, kept when the file fails. */
let workDir: string | undefined;
export function work(): string {
  if (!workDir) {
    workDir = mkdtempSync(join(tmpdir(), "lockd-ts-"));
    const dir = workDir;
    process.on("exit", (code) => {
      for (const p of processes) {
        try {
          p.kill("SIGCONT");
          p.kill("SIGKILL");
        } catch {
          // gone
        }
      }
      if (code === 0 && !process.exitCode && !process.env.LOCKD_TEST_KEEP) rmSync(dir, { recursive: true, force: true });
      else process.stderr.write(`lockd test logs and data kept in ${dir}\n`);
    });
  }
  return workDir;
}

const processes = new Set<ChildProcess>();

// A test process ended by a signal (the runner's timeout, ^C) still takes
// its members with it: the exit handler above runs only on a normal exit.
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"] as const) {
  process.once(sig, () => {
    for (const p of processes) {
      try {
        p.kill("SIGCONT");
        p.kill("SIGKILL");
      } catch {
        // gone
      }
    }
    process.exit(1);
  });
}

/** startProcess runs a binary with its output in log; it is killed when the test process exits. */
export function startProcess(file: string, args: string[], log: string): ChildProcess {
  const fd = openSync(log, "a");
  const p = spawn(file, args, { stdio: ["ignore", fd, fd] });
  processes.add(p);
  p.on("exit", () => processes.delete(p));
  return p;
}

/** stopProcess ends p with signal and waits for it to exit. */
export async function stopProcess(p: ChildProcess, signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise<void>((r) => p.once("exit", () => r()));
  if (signal === "SIGKILL") p.kill("SIGCONT");
  p.kill(signal);
  await exited;
}

/** poll calls f every `every` ms until it returns something other than undefined, or fails after ms. */
export async function poll<T>(what: string, ms: number, f: () => Promise<T | undefined> | T | undefined, every = 50): Promise<T> {
  const end = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await f();
      if (v !== undefined) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message})` : ""}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

/** getJSON fetches a URL and parses its JSON (numbers as JSON.parse does: tests read small ones only). */
export async function getJSON(url: string): Promise<{ status: number; body: any }> {
  const r = await fetch(url, { signal: AbortSignal.timeout(5000) });
  const text = await r.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  return { status: r.status, body };
}

export interface MemberOptions {
  extraArgs?: string[];
  scheme?: "http" | "https";
}

/** One lockd member process. */
export class Member {
  proc: ChildProcess | undefined;
  readonly dataDir: string;
  readonly log: string;
  stopped = false;

  constructor(
    readonly id: string,
    readonly httpPort: number,
    readonly raftPort: number,
    private readonly args: string[],
    readonly scheme: "http" | "https" = "http",
    cluster = 0,
  ) {
    const dir = join(work(), `cluster-${cluster}`);
    this.dataDir = join(dir, id);
    this.log = join(dir, `${id}.log`);
    mkdirSync(this.dataDir, { recursive: true });
  }

  get url(): string {
    return `${this.scheme}://127.0.0.1:${this.httpPort}`;
  }

  start(): void {
    this.proc = startProcess(
      bin("lockd"),
      ["--id", this.id, "--data-dir", this.dataDir, "--http-addr", `127.0.0.1:${this.httpPort}`, "--raft-addr", `127.0.0.1:${this.raftPort}`, ...this.args],
      this.log,
    );
    this.stopped = false;
  }

  /** kill9 kills the member at once (SIGKILL) and waits for it to go. */
  async kill9(): Promise<void> {
    if (this.proc) await stopProcess(this.proc, "SIGKILL");
  }

  pause(): void {
    this.proc?.kill("SIGSTOP");
    this.stopped = true;
  }

  resume(): void {
    this.proc?.kill("SIGCONT");
    this.stopped = false;
  }

  get alive(): boolean {
    return this.proc !== undefined && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  logTail(n = 20): string {
    try {
      return readFileSync(this.log, "utf8").split("\n").slice(-n).join("\n");
    } catch {
      return "";
    }
  }
}

let clusters = 0;

/** A cluster of lockd members on loopback. */
export class Cluster {
  private constructor(readonly members: Member[]) {}

  /** start runs n members (one: a cluster of itself; more: a static initial cluster) and waits until each is ready. */
  static async start(n: number, o: MemberOptions = {}): Promise<Cluster> {
    const ports = [];
    for (let i = 0; i < n; i++) ports.push({ http: await freePort(), raft: await freePort() });
    const ic = ports.map((p, i) => `n${i + 1}=127.0.0.1:${p.raft}`).join(",");
    const k = ++clusters;
    const members = ports.map((p, i) => new Member(`n${i + 1}`, p.http, p.raft, [...(n > 1 ? ["--initial-cluster", ic] : []), ...(o.extraArgs ?? [])], o.scheme, k));
    const c = new Cluster(members);
    for (const m of members) m.start();
    if (o.scheme !== "https") await c.ready();
    return c;
  }

  /** startStopped makes n members of one cluster without starting them (start each with member.start()). */
  static async startStopped(n: number, o: MemberOptions = {}): Promise<Cluster> {
    const ports = [];
    for (let i = 0; i < n; i++) ports.push({ http: await freePort(), raft: await freePort() });
    const ic = ports.map((p, i) => `n${i + 1}=127.0.0.1:${p.raft}`).join(",");
    const k = ++clusters;
    return new Cluster(ports.map((p, i) => new Member(`n${i + 1}`, p.http, p.raft, [...(n > 1 ? ["--initial-cluster", ic] : []), ...(o.extraArgs ?? [])], o.scheme, k)));
  }

  /** The members' URLs, for ClientOptions.endpoints. */
  get endpoints(): string[] {
    return this.members.map((m) => m.url);
  }

  member(url: string): Member {
    const m = this.members.find((x) => x.url === url.replace(/\/+$/, ""));
    if (!m) throw new Error(`no member at ${url}`);
    return m;
  }

  /** ready waits until every running member is ready (a leader known, its state current). */
  async ready(ms = 20000): Promise<void> {
    for (const m of this.members) {
      if (!m.alive || m.stopped) continue;
      await poll(`member ${m.id} ready`, ms, async () => ((await fetch(`${m.url}/readyz`, { signal: AbortSignal.timeout(2000) })).ok ? true : undefined));
    }
  }

  /** leader waits until the running members agree on a leader, and returns it. */
  async leader(ms = 10000): Promise<Member> {
    return poll("a leader", ms, async () => {
      let id: string | undefined;
      for (const m of this.members) {
        if (!m.alive || m.stopped) continue;
        const { body } = await getJSON(`${m.url}/api/v1/cluster`);
        if (!body.leader_id || (id !== undefined && body.leader_id !== id)) return undefined;
        id = body.leader_id;
      }
      const l = this.members.find((m) => m.id === id);
      if (!l || !l.alive || l.stopped) return undefined;
      const r = await fetch(`${l.url}/readyz`, { signal: AbortSignal.timeout(2000) });
      return r.ok ? l : undefined;
    });
  }

  /** restart starts a killed member again on its data dir and waits until it is ready. */
  async restart(m: Member): Promise<void> {
    m.start();
    await poll(`member ${m.id} ready after restart`, 20000, async () => ((await fetch(`${m.url}/readyz`, { signal: AbortSignal.timeout(2000) })).ok ? true : undefined));
  }

  async stop(): Promise<void> {
    await Promise.all(this.members.map((m) => (m.proc ? stopProcess(m.proc, "SIGKILL") : undefined)));
  }
}

/**
 * Proxy forwards TCP connections from a loopback port to a target; cut()
 * drops every connection and refuses new ones until heal(). It stands
 * between one client and one member to take that client away.
 */
export class Proxy {
  private readonly sockets = new Set<net.Socket>();
  private blocked = false;
  private constructor(
    private readonly server: net.Server,
    readonly port: number,
  ) {}

  static async start(targetPort: number): Promise<Proxy> {
    const port = await freePort();
    const server = net.createServer();
    const p = new Proxy(server, port);
    server.on("connection", (a) => {
      if (p.blocked) {
        a.destroy();
        return;
      }
      const b = net.connect(targetPort, "127.0.0.1");
      p.sockets.add(a);
      p.sockets.add(b);
      const drop = () => {
        a.destroy();
        b.destroy();
        p.sockets.delete(a);
        p.sockets.delete(b);
      };
      a.on("error", drop);
      b.on("error", drop);
      a.on("close", drop);
      b.on("close", drop);
      a.pipe(b);
      b.pipe(a);
    });
    await new Promise<void>((r) => server.listen(port, "127.0.0.1", () => r()));
    return p;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  cut(): void {
    this.blocked = true;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  heal(): void {
    this.blocked = false;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

/** startFencestore runs a fencestore on a free port and waits until it answers. */
export async function startFencestore(): Promise<{ url: string; proc: ChildProcess }> {
  const port = await freePort();
  const dir = join(work(), `fencestore-${port}`);
  mkdirSync(dir, { recursive: true });
  const proc = startProcess(bin("fencestore"), ["--addr", `127.0.0.1:${port}`, "--data-dir", dir], join(work(), `fencestore-${port}.log`));
  const url = `http://127.0.0.1:${port}`;
  await poll("fencestore up", 10000, async () => {
    await fetch(`${url}/v1/objects/probe`, { signal: AbortSignal.timeout(1000) });
    return true;
  });
  return { url, proc };
}

/** fencedPut writes value to key on a fencestore with the lock's fencing headers. */
export async function fencedPut(url: string, key: string, value: string, headers: Record<string, string>): Promise<{ status: number; body: any }> {
  const r = await fetch(`${url}/v1/objects/${encodeURIComponent(key)}`, { method: "PUT", body: value, headers, signal: AbortSignal.timeout(5000) });
  const text = await r.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // the value itself
  }
  return { status: r.status, body };
}

/** elapsed measures milliseconds since start (performance.now()). */
export function since(start: number): number {
  return performance.now() - start;
}

/** within resolves as p does, or fails naming what did not happen within ms. */
export async function within<T>(p: Promise<T>, ms: number, what: string | (() => string)): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, rej) => (t = setTimeout(() => rej(new Error(`${typeof what === "string" ? what : what()}: not within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(t);
  }
}
