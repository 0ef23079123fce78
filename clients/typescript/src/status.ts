// Lock status as the package hands it out: the wire's snake_case fields in
// camelCase, tokens and indexes as bigint, times as Date.

import type { WireHolder, WireLockStatus } from "./wire.js";

/** One grant of a lock. */
export interface Holder {
  clientId: string;
  fencingToken: bigint;
  /** The grant's expiry (server clock); undefined for a grant without a TTL of its own. */
  expiresAt: Date | undefined;
  mode: "exclusive" | "shared";
  value: string | undefined;
}

/** A lock's status, as GET /api/v1/locks/{name} shows it. */
export interface LockStatus {
  lock: string;
  held: boolean;
  /** "none" when free. */
  mode: "none" | "exclusive" | "shared";
  /** The semaphore size (1 for an ordinary lock). */
  limit: number;
  /** Queued acquires. */
  waiters: number;
  /** The log index of the last committed change to this lock's status. */
  index: bigint;
  /** The holders by token, at most 64 of them (see holdersTotal). */
  holders: Holder[];
  /** How many holders there are in all (a status lists at most 64). */
  holdersTotal: number;
  /** The value of the holder with the lowest token. */
  value: string | undefined;
  /** The end of a running lock-delay. */
  delayedUntil: Date | undefined;
  /** The status is a member's own (a stale read), possibly behind the leader's. */
  stale: boolean;
}

/** parseTime reads an RFC 3339 time; undefined for "" or none. */
export function parseTime(s: string | undefined): Date | undefined {
  if (!s) return undefined;
  const t = Date.parse(s);
  return Number.isNaN(t) ? undefined : new Date(t);
}

function mode<T extends string>(m: string | undefined, fallback: T): T {
  return (m || fallback) as T;
}

export function toHolder(h: WireHolder): Holder {
  return {
    clientId: h.client_id,
    fencingToken: h.fencing_token,
    expiresAt: parseTime(h.expires_at),
    mode: mode(h.mode, "exclusive"),
    value: h.value,
  };
}

export function toLockStatus(s: WireLockStatus): LockStatus {
  let holders = (s.holders ?? []).map(toHolder);
  if (holders.length === 0 && s.held && s.client_id !== undefined && s.fencing_token !== undefined) {
    // A status of the older shape names only the holder with the lowest token.
    holders = [{ clientId: s.client_id, fencingToken: s.fencing_token, expiresAt: parseTime(s.expires_at), mode: mode(s.mode, "exclusive") as "exclusive" | "shared", value: s.value }];
  }
  return {
    lock: s.lock,
    held: s.held,
    mode: mode(s.mode, "none"),
    limit: s.limit,
    waiters: s.waiters,
    index: s.index,
    holders,
    holdersTotal: s.holders_total,
    value: s.value,
    delayedUntil: parseTime(s.delayed_until),
    stale: s.stale ?? false,
  };
}

/** hasState reports a status with holders, waiters or a running delay: one a prefix watch's first picture shows. */
export function hasState(s: LockStatus): boolean {
  return s.held || s.holders.length > 0 || s.waiters > 0 || s.delayedUntil !== undefined;
}

/** freeStatus is the status of a lock without state, as of index. */
export function freeStatus(lock: string, index: bigint): LockStatus {
  return { lock, held: false, mode: "none", limit: 1, waiters: 0, index, holders: [], holdersTotal: 0, value: undefined, delayedUntil: undefined, stale: false };
}
