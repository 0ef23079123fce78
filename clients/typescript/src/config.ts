// Options of a Client, their defaults and their checks.

import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { InvalidArgumentError } from "./errors.js";
import { normalizeEndpoint } from "./redirect.js";

/** PEM text (or several), as Node's tls module takes it. */
export type PEM = string | Buffer | Array<string | Buffer>;

/** TLS for https:// endpoints and the wss:// session. */
export interface TLSOptions {
  /** The CA(s) that signed the members' certificates (default: Node's trusted roots). */
  ca?: PEM;
  /** A client certificate (PEM) to present when the members require one (mTLS). */
  cert?: PEM;
  /** The private key (PEM) of cert. */
  key?: PEM;
  /** Check the members' certificates (default true). Turn off only in tests. */
  rejectUnauthorized?: boolean;
}

/** Where the client says what it does; each method is optional. Default: silent. */
export interface Logger {
  debug?(msg: string, fields?: Record<string, unknown>): void;
  info?(msg: string, fields?: Record<string, unknown>): void;
  warn?(msg: string, fields?: Record<string, unknown>): void;
}

export interface ClientOptions {
  /**
   * Base HTTP URLs of cluster members, e.g. "http://127.0.0.1:7070" or
   * "https://10.0.0.1:7070". Any member will do: followers point to the
   * leader. Give all of them, so that the client finds a new leader when
   * the one it knows is gone.
   */
  endpoints: string[];
  /**
   * The session's TTL: the session (and every lock bound to it) ends when
   * no keepalive reached the leader for this long. Default 15000; 1000 to
   * 3 600 000.
   */
  sessionTtlMs?: number;
  /**
   * Who this client is to lockd; acquire is idempotent per client id, so
   * two Clients with one id are one holder. Default:
   * "<hostname>:<pid>:<12 random hex digits>", different for every Client.
   */
  clientId?: string;
  /** A bearer token, sent on every request and on the WebSocket upgrade (lockd --auth-file). */
  token?: string;
  /** TLS for https:// endpoints: the members' CA, a client certificate and key. */
  tls?: TLSOptions;
  /**
   * How long Client.connect looks for a leader before it gives up with a
   * NoLeaderError naming the last attempt's error. Default 10000; a
   * negative value leaves it to `signal`. It bounds only the first
   * connect: later reconnects go on until close(), and the session's lease
   * decides meanwhile.
   */
  dialTimeoutMs?: number;
  /** Bounds one connect attempt to one member (TCP, TLS, WebSocket upgrade and hello). Default 2000. */
  attemptTimeoutMs?: number;
  /** The least and the most wait between rounds of retries (jittered, doubling). Defaults 50 and 1000. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Bounds the clean-up close() does on the server (deleting the session). Default 5000. */
  closeTimeoutMs?: number;
  /**
   * How much earlier than "send time + TTL" a lease (the session's, or a
   * lock's own TTL) counts as run out, for timer lateness and clock-rate
   * drift. Default: a twentieth of the TTL, at most 100 ms, plus a
   * thousandth of it (130 ms of 30 s). Negative: no margin.
   */
  leaseMarginMs?: number;
  /** Bounds Client.connect, together with dialTimeoutMs. */
  signal?: AbortSignal;
  logger?: Logger;
}

/** Limits of the API (docs/API.md, "Limits"). */
export const limits = {
  minSessionTtlMs: 1000,
  maxSessionTtlMs: 3_600_000,
  minTtlMs: 100,
  maxTtlMs: 86_400_000,
  maxWaitTimeoutMs: 600_000,
  maxLimit: 10_000,
  maxLockDelayMs: 60_000,
  maxValueBytes: 4096,
  maxClientIdBytes: 128,
  maxLockNameBytes: 256,
  maxMultiLocks: 64,
} as const;

export interface Config {
  endpoints: string[];
  sessionTtlMs: number;
  clientId: string;
  token: string | undefined;
  tls: TLSOptions | undefined;
  dialTimeoutMs: number;
  attemptTimeoutMs: number;
  minBackoffMs: number;
  maxBackoffMs: number;
  closeTimeoutMs: number;
  leaseMarginMs: number | undefined;
  signal: AbortSignal | undefined;
  logger: Logger;
}

/** defaultClientId is "<hostname>:<pid>:<random>", cut to the longest id lockd takes. */
export function defaultClientId(): string {
  const suffix = ":" + randomBytes(6).toString("hex");
  let id = `${hostname() || "localhost"}:${process.pid}`;
  const room = limits.maxClientIdBytes - suffix.length;
  while (Buffer.byteLength(id) > room) id = id.slice(1);
  return id + suffix;
}

function checkMs(name: string, v: number | undefined, lo: number, hi: number): void {
  if (v === undefined) return;
  if (!Number.isSafeInteger(v) || v < lo || v > hi) {
    throw new InvalidArgumentError(`lockd: ${name} ${v} out of range ${lo}–${hi}`);
  }
}

/** configure checks options and fills in the defaults. */
export function configure(o: ClientOptions): Config {
  if (!o || !Array.isArray(o.endpoints) || o.endpoints.length === 0) {
    throw new InvalidArgumentError("lockd: no endpoints");
  }
  const endpoints = o.endpoints.map((e) => {
    let u: URL;
    try {
      u = new URL(e);
    } catch {
      throw new InvalidArgumentError(`lockd: endpoint ${JSON.stringify(e)} is not an http(s) URL`);
    }
    if ((u.protocol !== "http:" && u.protocol !== "https:") || u.hostname === "" || u.search || u.hash || u.username) {
      throw new InvalidArgumentError(`lockd: endpoint ${JSON.stringify(e)} is not an http(s) base URL`);
    }
    return normalizeEndpoint(e);
  });
  checkMs("sessionTtlMs", o.sessionTtlMs, limits.minSessionTtlMs, limits.maxSessionTtlMs);
  checkMs("attemptTimeoutMs", o.attemptTimeoutMs, 1, 3_600_000);
  checkMs("minBackoffMs", o.minBackoffMs, 1, 3_600_000);
  checkMs("maxBackoffMs", o.maxBackoffMs, 1, 3_600_000);
  checkMs("closeTimeoutMs", o.closeTimeoutMs, 0, 3_600_000);
  if (o.dialTimeoutMs !== undefined && !Number.isSafeInteger(o.dialTimeoutMs)) {
    throw new InvalidArgumentError(`lockd: dialTimeoutMs ${o.dialTimeoutMs} is not an integer`);
  }
  const clientId = o.clientId ?? defaultClientId();
  checkClientId(clientId);
  if (o.token !== undefined && (o.token !== o.token.trim() || /[\r\n\0]/.test(o.token) || o.token === "")) {
    throw new InvalidArgumentError("lockd: token is empty or has surrounding spaces or control characters");
  }
  const sessionTtlMs = o.sessionTtlMs ?? 15000;
  const minBackoffMs = o.minBackoffMs ?? 50;
  const maxBackoffMs = o.maxBackoffMs ?? Math.max(1000, minBackoffMs);
  if (maxBackoffMs < minBackoffMs) {
    throw new InvalidArgumentError("lockd: maxBackoffMs is below minBackoffMs");
  }
  if (o.leaseMarginMs !== undefined && o.leaseMarginMs >= sessionTtlMs) {
    throw new InvalidArgumentError(`lockd: leaseMarginMs ${o.leaseMarginMs} not below sessionTtlMs ${sessionTtlMs}`);
  }
  return {
    endpoints,
    sessionTtlMs,
    clientId,
    token: o.token,
    tls: o.tls,
    dialTimeoutMs: o.dialTimeoutMs ?? 10000,
    attemptTimeoutMs: o.attemptTimeoutMs ?? 2000,
    minBackoffMs,
    maxBackoffMs,
    closeTimeoutMs: o.closeTimeoutMs ?? 5000,
    leaseMarginMs: o.leaseMarginMs,
    signal: o.signal,
    logger: o.logger ?? {},
  };
}

export function checkClientId(id: string): void {
  if (typeof id !== "string" || id === "" || Buffer.byteLength(id) > limits.maxClientIdBytes) {
    throw new InvalidArgumentError(`lockd: client id must be 1–${limits.maxClientIdBytes} bytes`);
  }
  if (/[\u0000-\u001f\u007f]/.test(id)) {
    throw new InvalidArgumentError(`lockd: client id ${JSON.stringify(id)} is not printable`);
  }
}

const lockName = /^[A-Za-z0-9._:/-]{1,256}$/;

/** checkLockName refuses a name the server would (1–256 bytes of [A-Za-z0-9._:/-]). */
export function checkLockName(name: unknown): asserts name is string {
  if (typeof name !== "string" || !lockName.test(name)) {
    throw new InvalidArgumentError(`lockd: lock name ${JSON.stringify(name)} is not 1–256 characters of [A-Za-z0-9._:/-]`);
  }
}

/** checkValue refuses a value the server would (valid UTF-8 of at most 4096 bytes). */
export function checkValue(v: unknown): asserts v is string {
  if (typeof v !== "string") {
    throw new InvalidArgumentError("lockd: a value is a string");
  }
  if (!isWellFormed(v) || Buffer.byteLength(v) > limits.maxValueBytes) {
    throw new InvalidArgumentError(`lockd: a value is valid UTF-8 of at most ${limits.maxValueBytes} bytes (got ${Buffer.byteLength(v)} bytes)`);
  }
}

// String.prototype.isWellFormed is Node 20's too, but not in the ES2022 lib.
function isWellFormed(s: string): boolean {
  return !/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s);
}
