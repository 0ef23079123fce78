// Elections: a leader election on one lock, in the shape of etcd's
// concurrency.Election and the Go client's Election. Campaign is an acquire
// that waits, with a value; proclaim sets the value; resign releases;
// leader reads the lock's status; observe watches it.

import type { AcquireOptions, Client } from "./client.js";
import { checkValue } from "./config.js";
import { ElectionNoLeaderError, ElectionNotLeaderError, NotHolderError, UnknownOutcomeError } from "./errors.js";
import type { CallOptions, Lock } from "./lock.js";
import type { LockStatus } from "./status.js";

/** The leader of an election: the holder of its lock. */
export interface LeaderInfo {
  /** What the leader campaigned with or last proclaimed. */
  value: string;
  /** The leader's client id. */
  clientId: string;
  /** The fencing token of the leadership: every new leader has a higher one. */
  fencingToken: bigint;
  /** The log index of the lock status this was read from. */
  index: bigint;
}

/** leaderOf is the leader a lock status shows: the holder with the lowest token. */
export function leaderOf(st: LockStatus): LeaderInfo | undefined {
  const h = st.holders[0];
  if (!h) return undefined;
  return { value: h.value ?? "", clientId: h.clientId, fencingToken: h.fencingToken, index: st.index };
}

/**
 * Election is a leader election on one lock. Candidates campaign with a
 * value; the one elected holds the lock (and its fencing token) until it
 * resigns or its session ends, and everyone can read or observe the
 * leader's value. Candidates are elected in the order they campaigned.
 * Leadership is bound to the Client's session: when the leader's process
 * dies or is cut off, its session expires and the next candidate is
 * elected; the old leader's signal aborts before that can happen (the
 * client's conservative local lease). Use one Election per candidate and
 * Client; one campaign at a time.
 */
export class Election {
  private held: Lock | undefined;

  /** @internal */
  constructor(
    private readonly client: Client,
    /** The name of the election's lock. */
    readonly name: string,
  ) {}

  /**
   * campaign waits until this candidate is elected, with value as the
   * leader's value; it rejects with the signal's reason when
   * options.signal aborts first (the wait is withdrawn), or a ClosedError.
   * While this candidate leads, campaign proclaims value instead. A lock of
   * that name used as a semaphore rejects with a LimitMismatchError: an
   * election has one leader.
   */
  async campaign(value: string, options: Pick<AcquireOptions, "signal" | "waitTimeoutMs"> = {}): Promise<void> {
    checkValue(value);
    if (this.held && !this.held.lost) return this.proclaim(value, options);
    this.held = await this.client.acquire(this.name, { value, limit: 1, signal: options.signal, waitTimeoutMs: options.waitTimeoutMs });
  }

  /** proclaim sets the leader's value while this candidate leads; otherwise it rejects with an ElectionNotLeaderError. */
  async proclaim(value: string, options: CallOptions = {}): Promise<void> {
    const l = this.current();
    try {
      await l.setValue(value, options);
    } catch (e) {
      if (e instanceof NotHolderError) throw new ElectionNotLeaderError(`lockd: election ${this.name}: ${e.message}`, { cause: e });
      throw e;
    }
  }

  /**
   * resign gives the leadership up, so that the next candidate is elected
   * in the same step; it resolves also when this candidate does not lead
   * (any more). Without an answer it rejects with an UnknownOutcomeError:
   * the leadership counts as ended and the client goes on releasing it in
   * the background.
   */
  async resign(options: CallOptions = {}): Promise<void> {
    const l = this.held;
    if (!l || l.lost) return;
    try {
      await l.release(options);
    } catch (e) {
      if (e instanceof UnknownOutcomeError) throw e;
      if (l.lost) return; // it ended anyway (lost meanwhile, or not held any more)
      throw e;
    }
  }

  /** leader reads the current leader (a linearizable read of the lock's status); with none it rejects with an ElectionNoLeaderError. */
  async leader(options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<LeaderInfo> {
    const li = leaderOf(await this.client.status(this.name, options));
    if (!li) throw new ElectionNoLeaderError(`lockd: election ${this.name} has no leader`);
    return li;
  }

  /**
   * observe follows the election's leader: the current leader (if there is
   * one), then each new leader as it is elected, in rising token order, and
   * each value a leader proclaims; a leader never comes twice with the
   * same value. Nothing comes while there is none. Leaders elected and
   * gone while the client was away may be skipped: the latest always
   * comes. It is a watch of the lock, ended by options.signal, by leaving
   * the loop, or by closing the client.
   */
  observe(options: { signal?: AbortSignal } = {}): AsyncIterableIterator<LeaderInfo> {
    const w = this.client.watch({ lock: this.name, signal: options.signal });
    let last: LeaderInfo | undefined;
    const it: AsyncIterableIterator<LeaderInfo> = {
      [Symbol.asyncIterator]() {
        return it;
      },
      async next(): Promise<IteratorResult<LeaderInfo>> {
        for (;;) {
          const r = await w.next();
          if (r.done) return { value: undefined, done: true };
          const li = leaderOf(r.value.status);
          if (!li) continue;
          if (last && (li.fencingToken < last.fencingToken || (li.fencingToken === last.fencingToken && li.value === last.value))) continue;
          last = li;
          return { value: li, done: false };
        }
      },
      async return(): Promise<IteratorResult<LeaderInfo>> {
        await w.return();
        return { value: undefined, done: true };
      },
    };
    return it;
  }

  /** Whether this candidate leads now. */
  get leading(): boolean {
    return this.held !== undefined && !this.held.lost;
  }

  /**
   * Aborted when the leadership ends (resigned, lost, the client closed);
   * its reason says why. Before this candidate was ever elected it is
   * aborted already: read it again after campaign. A leader stops acting
   * as one when it aborts.
   */
  get signal(): AbortSignal {
    return this.held?.signal ?? AbortSignal.abort(new ElectionNotLeaderError(`lockd: election ${this.name}: not elected`));
  }

  /**
   * The fencing token of the leadership this candidate won last (undefined
   * before), also after it ended: a resource that takes fenced writes
   * refuses it once a newer leader wrote. Check signal before acting.
   */
  get fencingToken(): bigint | undefined {
    return this.held?.fencingToken;
  }

  /** The lock of the leadership won last (undefined before): its token and fencing headers. */
  get lock(): Lock | undefined {
    return this.held;
  }

  private current(): Lock {
    const l = this.held;
    if (!l) throw new ElectionNotLeaderError(`lockd: election ${this.name}: not elected`);
    if (l.lost) throw new ElectionNotLeaderError(`lockd: election ${this.name}: leadership ended: ${l.reason?.message}`, { cause: l.reason });
    return l;
  }
}
