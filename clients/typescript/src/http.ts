// The plain HTTP API, for what the session's WebSocket does not carry:
// lock status (the check after a resume, Election.leader), revocation and
// deleting a session. It follows leader redirects (307) within the cluster
// (see redirect.ts), remembers the leader, and retries 503 no_leader and
// overloaded (after Retry-After) and unreachable members on the other
// endpoints, with backoff, until the call's time is up.

import * as http from "node:http";
import * as https from "node:https";
import { Backoff, linked, sleep } from "./backoff.js";
import type { Config } from "./config.js";
import {
  HTTPSRequiredError,
  LockdError,
  NoLeaderError,
  UntrustedRedirectError,
  codeForStatus,
  serverError,
} from "./errors.js";
import { parseJSON } from "./json.js";
import { Trust, normalizeEndpoint } from "./redirect.js";

/** The body a plain HTTP member sends an HTTPS-only server (Go's, and most). */
const httpsOnlyReply = "Client sent an HTTP request to an HTTPS server";

/** Bounds a reply read into memory. */
const maxReplyBytes = 4 << 20;

/** Bounds the leader redirects of one attempt on one member. */
const maxRedirects = 5;

/** Network errors that mean the request never reached the member. */
const dialErrors = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "EADDRNOTAVAIL"]);

export interface HttpReply {
  status: number;
  text: string;
}

/** retryAfterMs reads a Retry-After header (seconds, or an HTTP date). */
export function retryAfterMs(h: string | string[] | undefined): number | undefined {
  const v = Array.isArray(h) ? h[0] : h;
  if (!v) return undefined;
  if (/^\d+$/.test(v.trim())) return Number(v.trim()) * 1000;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, t - Date.now());
}

/** errorFromReply is the error an error reply carries: its body's, or one its status implies. */
export function errorFromReply(status: number, text: string, headers: http.IncomingHttpHeaders): LockdError {
  let body: Record<string, unknown> = {};
  try {
    const v = parseJSON(text);
    if (typeof v === "object" && v !== null) body = v as Record<string, unknown>;
  } catch {
    // not JSON: the status speaks
  }
  const e = (body.error ?? {}) as Record<string, unknown>;
  const code = typeof e.code === "string" ? e.code : codeForStatus(status);
  const message = typeof e.message === "string" ? e.message : `HTTP ${status}: ${text.trim().slice(0, 200)}`;
  const str = (x: unknown) => (typeof x === "string" ? x : undefined);
  return serverError(code, message, {
    status,
    holder: str(body.holder),
    lock: str(body.lock),
    leader: str(body.leader),
    retryAfterMs: retryAfterMs(headers["retry-after"]),
  });
}

/** A failed attempt, and whether another member (or a later attempt) may succeed. */
interface Attempt {
  reply?: HttpReply;
  err?: unknown;
  retry?: boolean;
}

export class HttpApi {
  private leaderURL = "";
  private readonly httpAgent: http.Agent;
  private readonly httpsAgent: https.Agent;

  constructor(
    private readonly cfg: Config,
    readonly trust: Trust,
  ) {
    this.httpAgent = new http.Agent({ keepAlive: true });
    this.httpsAgent = new https.Agent({
      keepAlive: true,
      ca: cfg.tls?.ca,
      cert: cfg.tls?.cert,
      key: cfg.tls?.key,
      rejectUnauthorized: cfg.tls?.rejectUnauthorized ?? true,
    });
  }

  /** The leader's base URL as last seen, or "". */
  get leader(): string {
    return this.leaderURL;
  }

  setLeader(u: string): void {
    if (u) this.leaderURL = normalizeEndpoint(u);
  }

  /** The members to try, the known leader first. */
  candidates(): string[] {
    const l = this.leaderURL;
    const out = l ? [l] : [];
    for (const e of this.cfg.endpoints) if (e !== l) out.push(e);
    return out;
  }

  /** The agent for a URL (it carries the TLS options). */
  agentFor(u: string): http.Agent {
    return u.startsWith("https:") ? this.httpsAgent : this.httpAgent;
  }

  close(): void {
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
  }

  /**
   * call sends a request to the leader and returns its 2xx reply; an error
   * reply throws its LockdError. It retries as the class says until
   * `signal` aborts or timeoutMs (default the client's dialTimeoutMs)
   * passes; then it throws a NoLeaderError naming the last error. A write
   * is retried only when it never reached a member.
   */
  async call(method: string, path: string, opts: { body?: unknown; signal?: AbortSignal; timeoutMs?: number } = {}): Promise<HttpReply> {
    const timeoutMs = opts.timeoutMs ?? (this.cfg.dialTimeoutMs > 0 ? this.cfg.dialTimeoutMs : 10000);
    const link = linked([opts.signal], timeoutMs);
    try {
      return await this.callWithin(method, path, opts, link.signal, timeoutMs);
    } finally {
      link.dispose();
    }
  }

  private async callWithin(method: string, path: string, opts: { body?: unknown; signal?: AbortSignal }, signal: AbortSignal, timeoutMs: number): Promise<HttpReply> {
    const payload = opts.body === undefined ? undefined : JSON.stringify(opts.body);
    const bo = new Backoff(this.cfg.minBackoffMs, this.cfg.maxBackoffMs);
    let lastErr: unknown;
    for (;;) {
      let wait = 0;
      for (const base of this.candidates()) {
        const a = await this.attempt(method, base + path, payload, signal);
        if (a.reply) return a.reply;
        if (!a.retry) {
          if (signal.aborted && lastErr !== undefined && method === "GET") break;
          throw a.err;
        }
        lastErr = a.err;
        if (a.err instanceof LockdError && a.err.retryAfterMs !== undefined) {
          wait = Math.max(wait, a.err.retryAfterMs);
        }
        if (signal.aborted) break;
      }
      wait = Math.max(wait, bo.next());
      this.cfg.logger.debug?.("lockd: retrying", { method, path, err: String(lastErr), wait });
      if (signal.aborted || !(await sleep(wait, signal))) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (lastErr instanceof NoLeaderError) throw lastErr;
        throw new NoLeaderError(`lockd: no_leader: ${method} ${path}: no member answered within ${timeoutMs} ms (last error: ${describe(lastErr)})`, { cause: lastErr });
      }
    }
  }

  /** attempt sends the request to one member, following leader redirects. */
  private async attempt(method: string, url: string, payload: string | undefined, signal: AbortSignal): Promise<Attempt> {
    let u = url;
    for (let hop = 0; ; hop++) {
      let res: { status: number; headers: http.IncomingHttpHeaders; text: string };
      try {
        res = await this.send(method, u, payload, signal);
      } catch (e) {
        if (signal.aborted) return { err: e, retry: false };
        const code = (e as NodeJS.ErrnoException).code ?? "";
        return { err: new Error(`lockd: ${method} ${u}: ${(e as Error).message}`, { cause: e }), retry: dialErrors.has(code) || method === "GET" };
      }
      const { status, headers, text } = res;
      if (status === 307 || status === 308) {
        let target: { next: string; leader: string };
        try {
          target = this.trust.redirectTarget(new URL(u), header(headers["x-lockd-leader"]), header(headers.location));
        } catch (e) {
          if (e instanceof UntrustedRedirectError && e.fatal) {
            this.cfg.logger.warn?.("lockd: redirect refused", { err: e.message });
            return { err: e, retry: false };
          }
          return { err: e, retry: true };
        }
        this.setLeader(target.leader);
        if (hop >= maxRedirects) return { err: new Error(`lockd: ${method} ${url}: too many redirects`), retry: true };
        u = target.next;
        continue;
      }
      if (status >= 200 && status < 300) {
        const p = new URL(u);
        this.setLeader(`${p.protocol}//${p.host}`);
        return { reply: { status, text } };
      }
      if (status === 400 && text.includes(httpsOnlyReply)) {
        return { err: new HTTPSRequiredError(`lockd: ${u}: this member speaks HTTPS: use an https:// endpoint, and trust its CA (tls.ca)`), retry: false };
      }
      const err = errorFromReply(status, text, headers);
      return { err, retry: err.code === "no_leader" || err.code === "overloaded" };
    }
  }

  /** send is one HTTP request; it resolves with the reply, whatever its status. */
  private send(method: string, u: string, payload: string | undefined, signal: AbortSignal): Promise<{ status: number; headers: http.IncomingHttpHeaders; text: string }> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { Accept: "application/json" };
      if (payload !== undefined) {
        headers["Content-Type"] = "application/json";
        headers["Content-Length"] = String(Buffer.byteLength(payload));
      }
      if (this.cfg.token) headers.Authorization = `Bearer ${this.cfg.token}`;
      const mod = u.startsWith("https:") ? https : http;
      const req = mod.request(u, { method, headers, agent: this.agentFor(u), signal }, (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (c: Buffer) => {
          size += c.length;
          if (size > maxReplyBytes) {
            req.destroy(new Error(`reply over ${maxReplyBytes} bytes`));
            return;
          }
          chunks.push(c);
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end(payload);
    });
  }
}

function header(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

export function describe(e: unknown): string {
  if (e === undefined) return "none";
  return e instanceof Error ? e.message : String(e);
}

/** lockPath is the path of lock name (its / sent as %2F), with an action. */
export function lockPath(name: string, action = ""): string {
  return "/api/v1/locks/" + encodeURIComponent(name) + (action ? "/" + action : "");
}
