// Acquire options, their checks, and the pending acquire the client keeps
// until it is answered.

import { type Backoff, type Deferred, Notifier, deferred } from "./backoff.js";
import type { Conn } from "./conn.js";
import { checkLockName, checkValue, limits } from "./config.js";
import { InvalidArgumentError } from "./errors.js";
import type { Lock } from "./lock.js";
import type { Session } from "./session.js";

/** Options of acquire, tryAcquire, acquireMany and withLock. */
export interface AcquireOptions {
  /**
   * How long to wait in the lock's queue; when it runs out the acquire
   * rejects with a WaitTimeoutError. Without it the acquire waits until it
   * is granted or `signal` aborts (the wait is sent in periods of at most
   * 10 minutes; a new period queues again at the end of the queue).
   */
  waitTimeoutMs?: number;
  /**
   * A TTL of the lock's own on top of the session: it is lost when not
   * renewed within ttlMs (see autoRenew and Lock.renew), or when the
   * session ends, whichever is first. Without it the lock lives as long as
   * the session.
   */
  ttlMs?: number;
  /** Renew a lock with ttlMs every third of its TTL until it is released or lost. */
  autoRenew?: boolean;
  /** "exclusive" (default) or "shared" (a read-write lock: shared holders coexist, never with an exclusive one). */
  mode?: "exclusive" | "shared";
  /** Make the lock a semaphore of `limit` permits (1–10 000); the acquire that creates the lock sets it. */
  limit?: number;
  /** The grant's value (valid UTF-8, at most 4096 bytes), shown in the lock's status. */
  value?: string;
  /** When the grant ends without a release (TTL, session expiry, revocation), nobody gets the lock for this long (0–60 000 ms). */
  lockDelayMs?: number;
  /**
   * Aborting it gives up the acquire: it rejects with the signal's reason,
   * and a wait queued on the server is withdrawn (a cancel request); a grant
   * that committed meanwhile is released.
   */
  signal?: AbortSignal;
}

/** The acquire options, checked (the client's own). */
export interface AcquireOpts {
  ttlMs: number;
  wait: number;
  waitSet: boolean;
  autoRenew: boolean;
  mode: "exclusive" | "shared" | undefined;
  limit: number;
  lockDelayMs: number;
  value: string | undefined;
  signal: AbortSignal | undefined;
}

/** An acquire waiting for its grant (the client's own). It outlives a connection: it is re-sent on the next one and keeps its place. */
export interface AcquireOp {
  names: string[];
  o: AcquireOpts;
  try: boolean;
  /** The end of an explicit wait (now() time). */
  deadline: number;
  /** The caller went away; a grant that still comes is released. */
  abandoned: boolean;
  /** The withdrawal of an abandoned wait: not asked, asked, answered (withdrawn or nothing queued), or not supported by the server. */
  cancel: "none" | "sent" | "withdrawn" | "notQueued" | "unsupported";
  cancelChanged: Notifier;
  /** Requests sent for this wait, over every caller that adopted it; the last TTL one of them carried. */
  sends: number;
  lastTtl: number;
  /** Granted; a renew is confirming the lease before the lock is handed out. */
  confirming: boolean;
  sess: Session | undefined;
  conn: Conn | undefined;
  /** It went out on an earlier connection that failed before the answer (see LockdError.maybeGrantedLost). */
  resent: boolean;
  reqId: number;
  sentAt: number;
  /** When the server's wait of the last send ends (now() time). */
  serverDeadline: number;
  overloadBackoff: Backoff | undefined;
  done: Deferred<Lock[]>;
  finished: boolean;
}

export function sameNames(a: string[], b: string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

export function describeNames(names: string[]): string {
  return names.length === 1 ? `lock ${names[0]}` : `locks ${names.join(", ")}`;
}

/** newOp is a pending acquire of names, not sent yet. */
export function newOp(names: string[], o: AcquireOpts): AcquireOp {
  return {
    names,
    o,
    try: false,
    deadline: 0,
    abandoned: false,
    cancel: "none",
    cancelChanged: new Notifier(),
    sends: 0,
    lastTtl: 0,
    confirming: false,
    sess: undefined,
    conn: undefined,
    resent: false,
    reqId: 0,
    sentAt: 0,
    serverDeadline: 0,
    overloadBackoff: undefined,
    done: deferred<Lock[]>(),
    finished: false,
  };
}

export function checkAcquireOptions(o: AcquireOptions, tryOnly: boolean, multi = false): AcquireOpts {
  if (o === null || typeof o !== "object") throw new InvalidArgumentError("lockd: options must be an object");
  const int = (name: string, v: number | undefined, lo: number, hi: number) => {
    if (v !== undefined && (!Number.isSafeInteger(v) || v < lo || v > hi)) {
      throw new InvalidArgumentError(`lockd: ${name} ${v} out of range ${lo}–${hi}`);
    }
  };
  if (tryOnly && (o as AcquireOptions).waitTimeoutMs !== undefined) {
    throw new InvalidArgumentError("lockd: a try does not wait: no waitTimeoutMs");
  }
  int("waitTimeoutMs", o.waitTimeoutMs, 0, limits.maxWaitTimeoutMs);
  int("ttlMs", o.ttlMs, limits.minTtlMs, limits.maxTtlMs);
  int("limit", o.limit, 1, limits.maxLimit);
  int("lockDelayMs", o.lockDelayMs, 0, limits.maxLockDelayMs);
  if (o.mode !== undefined && o.mode !== "exclusive" && o.mode !== "shared") {
    throw new InvalidArgumentError(`lockd: mode ${JSON.stringify(o.mode)} is neither "exclusive" nor "shared"`);
  }
  if (o.mode === "shared" && (o.limit ?? 1) > 1) {
    throw new InvalidArgumentError(`lockd: a shared lock has no limit above 1 (got ${o.limit})`);
  }
  if (multi && (o.limit ?? 1) > 1) {
    throw new InvalidArgumentError(`lockd: acquireMany takes limit-1 locks only (got limit ${o.limit})`);
  }
  if (o.value !== undefined) checkValue(o.value);
  if (o.autoRenew && o.ttlMs === undefined) {
    throw new InvalidArgumentError("lockd: autoRenew needs ttlMs (a lock without a TTL of its own lives with the session)");
  }
  return {
    ttlMs: o.ttlMs ?? 0,
    wait: tryOnly ? 0 : (o.waitTimeoutMs ?? 0),
    waitSet: tryOnly || o.waitTimeoutMs !== undefined,
    autoRenew: o.autoRenew ?? false,
    mode: o.mode,
    limit: o.limit ?? 0,
    lockDelayMs: o.lockDelayMs ?? 0,
    value: o.value,
    signal: o.signal,
  };
}

/** lockSet checks a multi-acquire's names and sorts a copy of them. */
export function lockSet(names: string[]): string[] {
  if (!Array.isArray(names) || names.length < 2 || names.length > limits.maxMultiLocks) {
    throw new InvalidArgumentError(`lockd: acquireMany takes 2–${limits.maxMultiLocks} names, got ${Array.isArray(names) ? names.length : typeof names}`);
  }
  for (const n of names) checkLockName(n);
  const ns = [...names].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  for (let i = 1; i < ns.length; i++) {
    if (ns[i] === ns[i - 1]) throw new InvalidArgumentError(`lockd: acquireMany names lock ${ns[i]} twice`);
  }
  return ns;
}
