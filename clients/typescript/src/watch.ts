// Watches: a lock's (or a prefix's) committed changes as an async iterator.
// A watch outlives connections: on every new connection (a reconnect, a
// new leader) the client watches again, and hands out a lock's status only
// when its index is above the last one it handed out, so nothing comes
// twice or out of order and the latest state always comes. A lock a prefix
// watch showed with state that the new watch's first picture lacks (the
// server's `synced` frame ends that picture) was freed meanwhile: it comes
// as free, as of the synced index.

import { type Deferred, Notifier, deferred, sleep } from "./backoff.js";
import type { Client } from "./client.js";
import type { Conn } from "./conn.js";
import { checkLockName } from "./config.js";
import { InvalidArgumentError, type LockdError, serverError } from "./errors.js";
import { type LockStatus, freeStatus, hasState, toLockStatus } from "./status.js";
import { type ServerFrame, encodeRequest } from "./wire.js";

export interface WatchOptions {
  /** Watch this one lock. */
  lock?: string;
  /** Or every lock whose name starts with this ("" for every lock). */
  prefix?: string;
  /** Aborting it ends the watch (the iterator is then done). */
  signal?: AbortSignal;
  /**
   * How many changes the watch holds for a consumer that has not taken
   * them yet (default 1024). When they are full the client drops further
   * changes rather than hold anything up, and once the consumer has taken
   * what was held it reads the watched locks again (those changes are
   * marked resync): a slow consumer still sees every lock's latest state.
   */
  bufferSize?: number;
}

/** The status of a watched lock after a committed change. */
export interface WatchChange {
  /** The lock's name. */
  lock: string;
  /** The log index of the lock's last change (status.index); per lock, rising. */
  index: bigint;
  /** The lock's status right after that change (a lock whose last holder and waiter went is free). */
  status: LockStatus;
  /**
   * The status was read again rather than pushed as the next change: after
   * a reconnect or after the watch fell behind. Changes between the
   * previous one and this may have been folded into it.
   */
  resync: boolean;
}

const defaultBuffer = 1024;

/**
 * Watch is an async iterator of a lock's or a prefix's changes (see
 * Client.watch). Leave the loop, call return(), abort the signal, or close
 * the client to end it.
 */
export class Watch implements AsyncIterableIterator<WatchChange> {
  /** What is watched, for messages: `lock "x"` or `prefix "p"`. */
  readonly what: string;
  private readonly client: Client;
  private readonly lock: string | undefined;
  private readonly prefix: string | undefined;
  private readonly buffer: number;
  private readonly readyD: Deferred<void> = deferred<void>();
  private readonly syncedD: Deferred<bigint> = deferred<bigint>();
  private readonly onAbort: () => void;
  private readonly signal: AbortSignal | undefined;

  private queue: WatchChange[] = [];
  /** Wakes next() calls waiting for a change (any number of them). */
  private readonly wake = new Notifier();
  private ended = false;
  private failure: unknown;
  private started = false;
  /** The connection the server watch lives on (or is asked on), its watch_id there (0: none yet), the request awaiting its answer (0: none). */
  private conn: Conn | undefined;
  private id = 0;
  private reqId = 0;
  private gen = 0;
  /** A re-established watch whose first picture is still coming: its changes are marked resync. */
  private rereading = false;
  /** Locks in the first picture now coming in (a prefix watch's). */
  private seen = new Set<string>();
  /** The index of the last change queued per lock, and whether that lock had state then. */
  private readonly last = new Map<string, bigint>();
  private readonly state = new Map<string, boolean>();
  /** A change was dropped because the queue was full: read again once the consumer has emptied it. */
  private overflow = false;

  /** @internal */
  constructor(client: Client, o: WatchOptions) {
    if (o === null || typeof o !== "object") throw new InvalidArgumentError("lockd: watch options must be an object");
    if ((o.lock === undefined) === (o.prefix === undefined)) {
      throw new InvalidArgumentError("lockd: watch takes either lock or prefix");
    }
    if (o.lock !== undefined) checkLockName(o.lock);
    if (o.prefix !== undefined && o.prefix !== "") checkLockName(o.prefix);
    const buffer = o.bufferSize ?? defaultBuffer;
    if (!Number.isSafeInteger(buffer) || buffer < 1) throw new InvalidArgumentError(`lockd: watch bufferSize ${buffer}: want at least 1`);
    this.client = client;
    this.lock = o.lock;
    this.prefix = o.prefix;
    this.buffer = buffer;
    this.what = o.lock !== undefined ? `lock ${JSON.stringify(o.lock)}` : `prefix ${JSON.stringify(o.prefix)}`;
    this.signal = o.signal;
    this.onAbort = () => this.end();
    if (o.signal?.aborted) {
      this.ended = true;
      this.readyD.reject(o.signal.reason);
      return;
    }
    o.signal?.addEventListener("abort", this.onAbort, { once: true });
    client.watches.add(this);
    const conn = client.current;
    if (conn) {
      const f = this.frameFor(conn);
      if (f) conn.send(f); // on failure the next connection asks again
    }
  }

  /**
   * Resolves once the leader accepted the watch; rejects with its refusal
   * (an invalid name, no read access, too many watches), or when the
   * watch ends first.
   */
  get ready(): Promise<void> {
    return this.readyD.promise;
  }

  /** Resolves with the index of the watch's first complete picture (the server's synced frame). */
  get synced(): Promise<bigint> {
    return this.syncedD.promise;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<WatchChange, undefined>> {
    for (;;) {
      const v = this.queue.shift();
      if (v) {
        if (this.queue.length === 0 && this.overflow) {
          this.overflow = false;
          this.resync();
        }
        return { value: v, done: false };
      }
      if (this.failure !== undefined) {
        const e = this.failure;
        this.failure = undefined;
        throw e;
      }
      if (this.ended) return { value: undefined, done: true };
      await this.wake.wait();
    }
  }

  async return(): Promise<IteratorResult<WatchChange, undefined>> {
    this.end();
    return { value: undefined, done: true };
  }

  /** @internal end stops the watch: the iterator finishes what it holds, then is done (or throws failure). */
  end(failure?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.signal?.removeEventListener("abort", this.onAbort);
    this.client.watches.delete(this);
    if (failure !== undefined && !this.started) this.failure = failure;
    const err = failure ?? new Error("lockd: the watch ended");
    this.readyD.reject(err);
    this.syncedD.reject(err);
    const conn = this.conn;
    if (conn && this.id !== 0) {
      conn.watchIds.delete(this.id);
      if (conn === this.client.current) conn.send(this.unwatchFrame(conn, this.id));
      this.id = 0;
    }
    this.wake.notify();
  }

  /** @internal fail ends the watch because the server ended it: the iterator throws err once it has handed out what it holds. */
  fail(err: unknown): void {
    if (this.ended) return;
    this.id = 0; // the server's watch is gone: nothing to unwatch
    this.started = false;
    this.end(err);
  }

  /** @internal frameFor asks for the watch on conn and returns the request's frame. */
  frameFor(conn: Conn): string | undefined {
    if (this.ended) return undefined;
    this.gen++;
    this.reqId = this.client.nextId();
    this.conn = conn;
    this.id = 0;
    this.rereading = this.started;
    this.seen = new Set();
    conn.watchReqs.set(this.reqId, this);
    return this.lock !== undefined ? encodeRequest("watch", this.reqId, { lock: this.lock }) : encodeRequest("watch", this.reqId, { prefix: this.prefix! });
  }

  private unwatchFrame(conn: Conn, id: number): string {
    conn.watchIds.delete(id);
    const rid = this.client.nextId();
    conn.unwatches.add(rid);
    return encodeRequest("unwatch", rid, { watch_id: id });
  }

  /** @internal resync reads the watch again: a new server watch on the live connection replaces the old, its first picture the re-read. */
  resync(): void {
    const conn = this.client.current;
    if (this.ended || !conn || this.conn !== conn || this.reqId !== 0) {
      // Not on the live connection: the next one watches again anyway. Or
      // a watch request is under way: its first picture is to come.
      return;
    }
    if (this.id !== 0) {
      conn.send(this.unwatchFrame(conn, this.id));
      this.id = 0;
    }
    const f = this.frameFor(conn);
    if (f) conn.send(f);
  }

  /** @internal onReply takes the answer to a watch request. */
  onReply(conn: Conn, m: ServerFrame): void {
    const current = !this.ended && this.conn === conn && this.reqId === m.id;
    if (m.type === "ok" && !current) {
      if (m.watch_id) conn.send(this.unwatchFrame(conn, m.watch_id)); // nobody wants this watch any more
      return;
    }
    if (!current) return;
    this.reqId = 0;
    if (m.type === "ok" && m.watch_id) {
      this.id = m.watch_id;
      conn.watchIds.set(this.id, this);
      if (!this.started) {
        this.started = true;
        this.readyD.resolve();
      }
      return;
    }
    const err = serverError(m.error?.code ?? "internal", m.error?.message ?? `unexpected reply ${m.type}`);
    switch (err.code) {
      case "not_leader":
      case "no_leader":
        this.client.kill(conn, err.code); // asked again on the next connection
        return;
      case "session_expired":
        this.client.serverEndedSession();
        return;
    }
    if (!this.started) {
      this.end(new (err.constructor as new (msg: string, d: object) => LockdError)(`lockd: watch ${this.what}: ${err.message}`, { code: err.code, cause: err }));
      return;
    }
    // Refused after it was accepted once (a quota, a token reloaded with
    // less access, an overloaded member): try again later on this
    // connection.
    this.client.log("warn", "lockd: watching again was refused, retrying", { watch: this.what, err: err.message });
    const gen = this.gen;
    this.client.spawn(
      sleep(Math.max(this.client.cfg.maxBackoffMs, err.retryAfterMs ?? 0), conn.ac.signal).then((ok) => {
        if (!ok || this.ended || this.gen !== gen || this.reqId !== 0 || this.id !== 0 || this.conn !== conn || this.client.current !== conn) return;
        const f = this.frameFor(conn);
        if (f) conn.send(f);
      }),
    );
  }

  /** @internal onChanged takes a changed frame. */
  onChanged(m: ServerFrame): void {
    if (!m.status) return;
    const st = toLockStatus(m.status);
    const name = m.lock || st.lock;
    const idx = m.index ? m.index : st.index;
    const resync = this.rereading;
    if (this.lock !== undefined) this.rereading = false; // a single lock's first picture is one frame
    else if (this.rereading) this.seen.add(name);
    this.offer(name, idx, st, resync);
  }

  /** @internal onSynced takes the end of the first picture. */
  onSynced(m: ServerFrame): void {
    const idx = m.index!;
    if (this.rereading && this.prefix !== undefined) {
      // A lock shown with state before that the new picture lacks has no
      // state now: it was freed while the client was away.
      const names = [...this.state.entries()].filter(([n, had]) => had && !this.seen.has(n)).map(([n]) => n).sort();
      for (const n of names) this.offer(n, idx, freeStatus(n, idx), true);
    }
    this.rereading = false;
    this.seen = new Set();
    this.syncedD.resolve(idx);
  }

  /** offer queues a lock's status for the consumer if it is newer than the last one queued; with the queue full it drops it and marks the watch for a re-read. */
  private offer(name: string, idx: bigint, st: LockStatus, resync: boolean): void {
    if (this.ended) return;
    const last = this.last.get(name);
    if (last !== undefined && idx <= last) return;
    if (this.overflow || this.queue.length >= this.buffer) {
      if (!this.overflow) {
        this.client.log("info", "lockd: watch consumer fell behind; dropping changes until it catches up, then reading again", { watch: this.what, buffer: this.buffer });
      }
      this.overflow = true;
      return;
    }
    this.last.set(name, idx);
    this.state.set(name, hasState(st));
    this.queue.push({ lock: name, index: idx, status: st, resync });
    this.wake.notify();
  }
}
