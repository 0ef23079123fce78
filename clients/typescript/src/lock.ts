// A granted lock: its fencing token, its loss signal, and release, renew
// and setValue.

import { setMaxListeners } from "node:events";
import type { Client } from "./client.js";
import type { Session } from "./session.js";
import { checkValue, limits } from "./config.js";
import {
  InvalidArgumentError,
  LockdError,
  NotHolderError,
  ReleasedError,
  UnknownOutcomeError,
  serverError,
} from "./errors.js";
import type { WireError } from "./wire.js";

/** Fencing headers, as fencestore and the Go fence package read them. */
export const fencingHeaderNames = {
  token: "Fencing-Token",
  lock: "Fencing-Lock",
  proof: "Fencing-Proof",
} as const;

/** Options of a call that may be aborted. */
export interface CallOptions {
  /** Aborting it ends the call; it rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Lock is a granted lock. Its `signal` aborts the moment the lock stops
 * being held — lost (the local lease ran out, the server pushed "lost" or
 * said not_holder, the lock was revoked, the check after a reconnect found
 * it gone, the session ended), released, or the client closed — with the
 * cause as its reason (LeaseExpiredError, LockExpiredError, RevokedError,
 * NotHolderError, SessionExpiredError, ReleasedError, UnknownOutcomeError,
 * ClosedError). A lock of an acquireMany is also lost when any other lock of
 * that call is (not when one is released).
 */
export class Lock {
  /** The lock's name. */
  readonly name: string;
  /** The grant's fencing token: pass it to every resource the critical section writes to. */
  readonly fencingToken: bigint;
  /** @internal */ proof: string | undefined;
  /** The grant's mode: "shared", or "exclusive" (a semaphore's permits included). */
  readonly mode: "exclusive" | "shared";

  /** @internal */ readonly client: Client;
  /** @internal */ readonly sess: Session;
  /** @internal */ group: Lock[] | undefined;
  /** @internal A lock's own TTL (0: bound to the session only). */ ttlMs = 0;
  /** @internal The local lease of the TTL: send time of the confirming request + ttlMs (performance.now() time). */ deadline = 0;
  /** @internal */ expires: Date | undefined;
  /** @internal */ val: string | undefined;
  /** @internal */ err: LockdError | undefined;
  private readonly ac = new AbortController();
  private renewChain: Promise<unknown> = Promise.resolve();

  /** @internal */
  constructor(client: Client, sess: Session, name: string, token: bigint, proof: string | undefined, mode: "exclusive" | "shared", expires: Date | undefined) {
    this.client = client;
    this.sess = sess;
    this.name = name;
    this.fencingToken = token;
    this.proof = proof || undefined;
    this.mode = mode;
    this.expires = expires;
    // Every acquire of this name in this process waits on it, and so may
    // the user's own code: no bound on their number.
    setMaxListeners(0, this.ac.signal);
  }

  /**
   * The fencing proof the server signed for this grant (lockd
   * --signing-key), if any; a renew brings a fresh one for the new expiry,
   * so read it at each write.
   */
  get fencingProof(): string | undefined {
    return this.proof;
  }

  /** Aborted the moment the lock stops being held; its reason says why. */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  /** Whether the lock stopped being held (see signal). */
  get lost(): boolean {
    return this.err !== undefined;
  }

  /** Why the lock stopped being held; undefined while it is held. */
  get reason(): LockdError | undefined {
    return this.err;
  }

  /** The value this client last gave the grant (the acquire's, or the last setValue the server confirmed). */
  get value(): string | undefined {
    return this.val;
  }

  /** The expiry the server reported for the lock's own TTL (server clock); undefined for a lock bound only to its session. */
  get expiresAt(): Date | undefined {
    return this.expires;
  }

  /**
   * The conservative local lease: the moment `signal` aborts unless a
   * keepalive (or, for a lock with a TTL of its own, a renew) is confirmed
   * first. Before the server could give the lock to anyone else.
   */
  get leaseDeadline(): Date {
    return this.client.lockLeaseEnd(this);
  }

  /**
   * The headers a fenced write carries: Fencing-Token, Fencing-Lock and,
   * when the server signed the grant, Fencing-Proof.
   */
  fencingHeaders(): Record<string, string> {
    const h: Record<string, string> = {
      [fencingHeaderNames.token]: this.fencingToken.toString(),
      [fencingHeaderNames.lock]: this.name,
    };
    if (this.fencingProof) h[fencingHeaderNames.proof] = this.fencingProof;
    return h;
  }

  /**
   * release releases the lock. It resolves once the server confirmed, and
   * also for a lock already released. For a lock lost before, it rejects
   * with the cause of the loss; when the server says the lock is not held
   * any more, with a NotHolderError. When no answer comes (the signal
   * aborts, the session is lost while the leader is unreachable) the
   * server may have released it already: it rejects with an
   * UnknownOutcomeError, the lock counts as gone, and the client goes on
   * releasing it in the background (bounded by closeTimeoutMs).
   */
  async release(opts: CallOptions = {}): Promise<void> {
    if (this.err instanceof ReleasedError) return;
    if (this.err && !(this.err instanceof UnknownOutcomeError)) throw this.err;
    const r = await this.client.roundTrip(this.sess, "release", { lock: this.name, fencing_token: this.fencingToken }, opts.signal);
    if (r.err !== undefined || r.m === undefined) {
      if (this.err && !(this.err instanceof UnknownOutcomeError)) throw this.err;
      if (r.sentAt === 0 && opts.signal?.aborted) throw opts.signal.reason;
      const u = new UnknownOutcomeError(`lockd: releasing lock ${this.name} token ${this.fencingToken}: no answer`, { lock: this.name, cause: r.err });
      if (!this.err) {
        this.lose(u);
        this.client.releaseLater(this);
      }
      throw u;
    }
    if (r.m.type === "ok") {
      this.lose(new ReleasedError(`lockd: lock ${this.name} token ${this.fencingToken} released`, { lock: this.name }));
      return;
    }
    throw this.refused(r.m.error);
  }

  /**
   * renew extends the lock's TTL to ttlMs from now (default: the lock's
   * own TTL) and moves its local lease to the renew's send time + ttlMs.
   * For a lock bound only to its session, renew() sends a session
   * keepalive. When the server says the lock is gone, the lock is lost and
   * it rejects with a NotHolderError. Renews of one lock go one at a time.
   * A renew without an answer may still have been applied: the local lease
   * then ends no later than its send time + ttlMs.
   */
  renew(ttlMs?: number, opts: CallOptions = {}): Promise<void> {
    if (ttlMs !== undefined && (!Number.isSafeInteger(ttlMs) || ttlMs < limits.minTtlMs || ttlMs > limits.maxTtlMs)) {
      return Promise.reject(new InvalidArgumentError(`lockd: ttlMs ${ttlMs} out of range ${limits.minTtlMs}–${limits.maxTtlMs}`));
    }
    const p = this.renewChain.then(() => this.renewNow(ttlMs, opts.signal));
    this.renewChain = p.catch(() => {});
    return p;
  }

  private async renewNow(ttlArg: number | undefined, signal: AbortSignal | undefined): Promise<void> {
    if (this.err) throw this.err;
    const ttl = ttlArg ?? this.ttlMs;
    const c = this.client;
    if (ttl === 0) {
      const r = await c.roundTrip(this.sess, "keepalive", {}, signal);
      if (r.err !== undefined || r.m === undefined) throw r.err;
      if (r.m.type === "error") throw wireError(r.m.error);
      c.confirmSession(this.sess, r.sentAt, r.m.session_ttl_ms);
      if (this.err) throw this.err;
      return;
    }
    const r = await c.roundTrip(this.sess, "renew", { lock: this.name, fencing_token: this.fencingToken, ttl_ms: ttl }, signal);
    if (r.err !== undefined || r.m === undefined) {
      if (r.sentAt !== 0) this.maybeRenewed(r.sentAt, ttl);
      throw r.err;
    }
    const m = r.m;
    if (m.type === "ok") {
      if (this.err) throw this.err; // lost meanwhile, and lost stays lost
      this.ttlMs = ttl;
      this.deadline = r.sentAt + ttl;
      const exp = m.expires_at ? new Date(m.expires_at) : undefined;
      if (exp && !Number.isNaN(exp.getTime())) this.expires = exp;
      if (m.fencing_proof) this.proof = m.fencing_proof;
      c.armLease();
      return;
    }
    if (m.error && !refusedUnapplied(m.error.code)) this.maybeRenewed(r.sentAt, ttl);
    throw this.refused(m.error);
  }

  /**
   * setValue sets the grant's value (valid UTF-8 of at most 4096 bytes),
   * which the lock's status shows to everyone. When the server says the
   * lock is not held any more, the lock is lost and it rejects with a
   * NotHolderError; without an answer, with an UnknownOutcomeError.
   */
  async setValue(value: string, opts: CallOptions = {}): Promise<void> {
    checkValue(value);
    if (this.err) throw this.err;
    const r = await this.client.roundTrip(this.sess, "value", { lock: this.name, fencing_token: this.fencingToken, value }, opts.signal);
    if (r.err !== undefined || r.m === undefined) {
      if (r.sentAt !== 0 && !this.err) {
        throw new UnknownOutcomeError(`lockd: setting the value of lock ${this.name} token ${this.fencingToken}: no answer`, { lock: this.name, cause: r.err });
      }
      throw this.err ?? r.err;
    }
    if (r.m.type === "ok") {
      this.val = value;
      return;
    }
    throw this.refused(r.m.error);
  }

  /**
   * @internal maybeRenewed counts with a renew to ttl, sent at sentAt, that
   * may or may not have been applied: the server's expiry is then at least
   * sentAt+ttl or what it was, so the local lease ends at the earlier.
   */
  maybeRenewed(sentAt: number, ttl: number): void {
    if (this.err) return;
    const d = sentAt + ttl;
    if (this.ttlMs === 0) {
      this.ttlMs = ttl;
      this.deadline = d;
    } else if (d < this.deadline) {
      this.deadline = d;
    } else {
      return;
    }
    this.client.armLease();
  }

  /** @internal refused turns a refused request into its error; not_holder means the lock is gone, so it is lost too. */
  refused(e: WireError | undefined): LockdError {
    const err = wireError(e, this.name);
    if (err instanceof NotHolderError) {
      this.lose(new NotHolderError(`lockd: lock ${this.name} token ${this.fencingToken}: ${err.message}`, { lock: this.name, cause: err }));
    }
    return err;
  }

  /**
   * @internal lose marks the lock not held, for cause. Once lost, always
   * lost. A lock of an acquireMany that is lost (not released, not
   * closed) takes the others of its call with it: they are lost with the
   * same cause and released in the background.
   */
  lose(cause: LockdError): void {
    if (!this.markLost(cause) || !this.group || !losesGroup(cause)) return;
    for (const other of this.group) {
      if (other === this) continue;
      const why = new (cause.constructor as new (m: string, d: object) => LockdError)(
        `lockd: lock ${other.name} lost with lock ${this.name} of the same acquireMany: ${cause.message}`,
        { code: cause.code, lock: other.name, cause },
      );
      if (other.markLost(why) && !other.sess.lost && !this.client.isClosed) {
        this.client.releaseLater(other);
      }
    }
  }

  /** @internal markLost marks the lock not held unless it was already; it reports whether it did. */
  markLost(cause: LockdError): boolean {
    if (this.err) return false;
    this.err = cause;
    this.client.forgetLock(this);
    this.ac.abort(cause);
    return true;
  }
}

/** losesGroup reports a cause that ends the other locks of an acquireMany: anything but the caller's own release and the client's close. */
function losesGroup(cause: LockdError): boolean {
  return !(cause instanceof ReleasedError) && !(cause instanceof UnknownOutcomeError) && cause.code !== "closed";
}

/** refusedUnapplied reports an error code that says the request was refused before it could take effect. */
function refusedUnapplied(code: string): boolean {
  return ["not_holder", "invalid_argument", "unauthenticated", "permission_denied", "session_expired", "not_found", "overloaded"].includes(code);
}

/** wireError is the error of an error frame's body. */
export function wireError(e: WireError | undefined, lock?: string): LockdError {
  return serverError(e?.code ?? "internal", e?.message ?? "an error reply without an error", lock === undefined ? {} : { lock });
}
