// A session as the client sees it, and its lease: counted on the
// monotonic clock from the send time of the last request the leader
// confirmed, less a margin for timer lateness and clock-rate drift.

import { setMaxListeners } from "node:events";
import type { LockdError } from "./errors.js";

/** now is the monotonic clock every lease is counted on (ms). */
export const now = (): number => performance.now();

/** @internal One server session as the client sees it. */
export class Session {
  lost = false;
  err: LockdError | undefined;
  readonly ac = new AbortController();
  constructor(
    readonly id: string,
    public ttlMs: number,
    /** The local lease: send time of the last keepalive (or hello) the leader confirmed + ttlMs. */
    public deadline: number,
    /** No session at all: the connection of a token with read access only (watches and reads; no lease). */
    readonly readOnly = false,
  ) {
    setMaxListeners(0, this.ac.signal); // users may listen for the session's end as they like
  }

  /** readOnlySession stands for the connection of a read-only token, which carries no session. */
  static readOnlySession(): Session {
    return new Session("", 0, Infinity, true);
  }

  /** setTtl takes the session TTL the server reports; a shorter one shortens the lease at once. */
  setTtl(ttlMs: number | undefined): void {
    if (!ttlMs || ttlMs <= 0 || ttlMs === this.ttlMs) return;
    if (ttlMs < this.ttlMs) this.deadline += ttlMs - this.ttlMs;
    this.ttlMs = ttlMs;
  }
}

/**
 * leaseEnd is when a lease of ttl whose request was sent at deadline-ttl
 * counts as run out: deadline less the margin — marginMs when given (0 if
 * negative), else a twentieth of the TTL, at most 100 ms, plus a
 * thousandth of it (for clock-rate drift: 130 ms of 30 s, 3.7 s of an
 * hour).
 */
export function leaseEnd(deadline: number, ttl: number, marginMs: number | undefined): number {
  const m = marginMs ?? Math.min(ttl / 20, 100) + ttl / 1000;
  return deadline - Math.max(0, m);
}
