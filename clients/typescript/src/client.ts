// Client: one lockd session over one WebSocket to the leader. Requests are
// pipelined on it and matched by id; keepalives go out every TTL/3 and need
// the leader's answer; after a dropped connection or a leader change the
// client reconnects (following not_leader frames and 307s, trying every
// endpoint), resumes the session and re-sends pending acquires, which keep
// their queue places. Each lease — the session's, and a lock's own TTL —
// ends locally before the server's: it is counted from when the request
// that the server confirmed was SENT, less a margin.
//
// It is the Go client's model (client/ in this repository) in Node's terms:
// one event loop instead of a mutex, AbortSignals instead of contexts.

import { setMaxListeners } from "node:events";
import type WebSocket from "ws";
import { type AcquireOp, type AcquireOptions, type AcquireOpts, checkAcquireOptions, describeNames, lockSet, newOp, sameNames } from "./acquire.js";
import { Backoff, Notifier, deferred, linked, raceSignal, sleep } from "./backoff.js";
import { type ClientOptions, type Config, checkLockName, configure, limits } from "./config.js";
import { Conn, ConnLostError, type RoundTrip, UpgradeRefused, openSocket, wsURL } from "./conn.js";
import {
  ClosedError,
  CancelledError,
  HTTPSRequiredError,
  InvalidArgumentError,
  LeaseExpiredError,
  LockExpiredError,
  LockHeldError,
  LockdError,
  NoLeaderError,
  NotHolderError,
  PermissionDeniedError,
  ReleasedError,
  RevokedError,
  SessionExpiredError,
  UntrustedRedirectError,
  WaitTimeoutError,
  isAuthError,
  serverError,
} from "./errors.js";
import { Election } from "./election.js";
import { HttpApi, describe, errorFromReply, lockPath } from "./http.js";
import { Lock } from "./lock.js";
import { Trust } from "./redirect.js";
import { Session, leaseEnd, now } from "./session.js";
import { type LockStatus, toHolder, toLockStatus } from "./status.js";
import { Watch, type WatchOptions } from "./watch.js";
import {
  type DecodeError,
  type RequestFields,
  type RequestKind,
  type ServerFrame,
  type WireHolderPage,
  type WireLockStatus,
  type WireRevokeReply,
  decodeBody,
  encodeRequest,
  holderPageShape,
  lockStatusShape,
  revokeReplyShape,
} from "./wire.js";

export type { AcquireOptions } from "./acquire.js";

/** How long past an explicit wait's deadline an acquire still waits for the server's answer. */
const waitSlackMs = 1000;

/** Bounds the not_leader hops from one endpoint in one round. */
const maxLeaderHops = 3;

/**
 * Client is one lockd session over one WebSocket connection to the
 * leader. Create it with Client.connect, end it with close().
 */
export class Client {
  /** The client id the session was opened with. */
  readonly clientId: string;

  /** @internal */ readonly cfg: Config;
  /** @internal */ readonly http: HttpApi;
  private ids = 0;
  private closed = false;
  private closing: Promise<void> | undefined;
  private readonly closeAc = new AbortController();
  private cur: Conn | undefined;
  private readonly connChanged = new Notifier();
  private sess: Session | undefined;
  /** Sessions given up locally, still to delete on the server. */
  private orphans: string[] = [];
  private readonly locks = new Map<string, Lock>();
  /** Pending acquires by lock name, and by the id of their last request. */
  private readonly ops = new Map<string, AcquireOp>();
  private readonly opById = new Map<number, AcquireOp>();
  /** Background releases under way per lock name; relChanged fires when one ends. */
  private readonly releasing = new Map<string, number>();
  private readonly relChanged = new Notifier();
  /** @internal The active watches. */
  readonly watches = new Set<Watch>();
  private leaseTimer: NodeJS.Timeout | undefined;
  private readonly background = new Set<Promise<unknown>>();

  private constructor(cfg: Config) {
    // Every wait of the client (many at once under load) listens on it and
    // stops listening when done: no bound on their number.
    setMaxListeners(0, this.closeAc.signal);
    this.cfg = cfg;
    this.clientId = cfg.clientId;
    this.http = new HttpApi(cfg, new Trust(cfg.endpoints));
  }

  /**
   * connect opens a session with the cluster: it finds the leader from any
   * endpoint and says hello. It resolves once the session is established;
   * it rejects with a NoLeaderError (naming the last attempt's error as its
   * cause) when no member led to a leader within dialTimeoutMs (default
   * 10 s) or before options.signal aborted, at once with an
   * UnauthenticatedError or PermissionDeniedError when the cluster refuses
   * the token, with an HTTPSRequiredError for an http:// endpoint of an
   * HTTPS member, and with an UntrustedRedirectError when a configured
   * endpoint redirects outside the cluster.
   */
  static async connect(options: ClientOptions): Promise<Client> {
    const c = new Client(configure(options));
    const bound = linked([c.closeAc.signal, c.cfg.signal], c.cfg.dialTimeoutMs > 0 ? c.cfg.dialTimeoutMs : undefined);
    let conn: Conn;
    try {
      conn = await c.connectLoop(true, bound.signal);
    } catch (e) {
      c.closed = true;
      c.closeAc.abort();
      c.http.close();
      if (c.cfg.signal?.aborted && !(e instanceof LockdError && isAuthError(e))) {
        throw c.cfg.signal.reason;
      }
      throw e;
    } finally {
      bound.dispose();
    }
    c.spawn(c.run(conn));
    return c;
  }

  /** The id of the current session ("" before the first). A lost session is replaced by a new one for later calls. */
  get sessionId(): string {
    return this.sess?.id ?? "";
  }

  /**
   * A client whose token has read access only (no lock access on any
   * prefix): the cluster opens no session for it; watch, election observe
   * and leader, and status work, and acquires reject with a
   * PermissionDeniedError.
   */
  get readOnly(): boolean {
    return this.sess?.readOnly ?? false;
  }

  /** Aborted when the current session is lost (expired on the server, its local lease ran out, or close()); every lock of it is lost with it. */
  get sessionSignal(): AbortSignal {
    return this.sess?.ac.signal ?? AbortSignal.abort(new ClosedError());
  }

  /** @internal */
  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * acquire takes lock `name` in the client's session and resolves with
   * the Lock once granted — pushed by the server when it happens. It
   * rejects with a WaitTimeoutError when waitTimeoutMs runs out, with the
   * signal's reason when options.signal aborts (the queued wait is then
   * withdrawn), with a LimitMismatchError, ResourceExhaustedError,
   * InvalidArgumentError, ... as the server says, and with a ClosedError
   * once the client is closed. A Client is one holder: an acquire of a
   * lock this Client already holds (or is acquiring in another call)
   * waits until that is released.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<Lock> {
    checkLockName(name);
    const ls = await this.acquireNames([name], checkAcquireOptions(options, false), false);
    return ls[0]!;
  }

  /**
   * tryAcquire takes lock `name` if it can be granted now; otherwise it
   * rejects with a LockHeldError naming the holder (the one with the
   * lowest token; "" when the lock is free but not for a newcomer: a
   * waiter ahead, or a lock-delay). A lock this Client already holds, or
   * is acquiring in another call, is not free either: the LockHeldError
   * then says byThisClient.
   */
  async tryAcquire(name: string, options: Omit<AcquireOptions, "waitTimeoutMs"> = {}): Promise<Lock> {
    checkLockName(name);
    const ls = await this.acquireNames([name], checkAcquireOptions(options, true), true);
    return ls[0]!;
  }

  /**
   * acquireMany takes every lock of `names` in one step, or none (2–64
   * distinct names of limit-1 locks). It waits in every lock's queue at
   * once and is granted when it heads every queue and every lock is free,
   * so overlapping acquireMany calls never deadlock, whatever order they
   * name the locks in. It resolves with one Lock per name, in name order
   * (sorted), each with its own token. They share one fate: when one is
   * lost, all are (see Lock.signal); a release of one is that lock's
   * alone.
   */
  async acquireMany(names: string[], options: AcquireOptions = {}): Promise<Lock[]> {
    return this.acquireNames(lockSet(names), checkAcquireOptions(options, false, true), false);
  }

  /** tryAcquireMany is acquireMany without waiting: every lock if all can be granted now, else a LockHeldError naming the first blocking lock and its holder. */
  async tryAcquireMany(names: string[], options: Omit<AcquireOptions, "waitTimeoutMs"> = {}): Promise<Lock[]> {
    return this.acquireNames(lockSet(names), checkAcquireOptions(options, true, true), true);
  }

  /**
   * withLock acquires lock `name` (as acquire, with options), runs fn with
   * a signal that aborts the moment the lock is lost (or options.signal
   * aborts) and the lock's fencing token, then releases the lock and
   * resolves with fn's result. It rejects with fn's error; if fn resolved
   * but the lock was lost meanwhile, with the loss (the result may have
   * been made without the lock); else with the release's error.
   */
  async withLock<T>(name: string, fn: (signal: AbortSignal, fencingToken: bigint, lock: Lock) => T | Promise<T>, options: AcquireOptions = {}): Promise<T> {
    const lock = await this.acquire(name, options);
    const link = linked([lock.signal, options.signal]);
    let result: T | undefined;
    let failed = false;
    let ferr: unknown;
    try {
      result = await fn(link.signal, lock.fencingToken, lock);
    } catch (e) {
      failed = true;
      ferr = e;
    } finally {
      link.dispose();
    }
    const lost = lock.reason;
    let rerr: unknown;
    try {
      await lock.release({ signal: AbortSignal.timeout(this.cfg.closeTimeoutMs) });
    } catch (e) {
      rerr = e;
    }
    if (failed) throw ferr;
    if (lost) throw lost;
    if (rerr !== undefined) throw rerr;
    return result as T;
  }

  /** election returns the election on lock `name`, for candidates of this client. */
  election(name: string): Election {
    checkLockName(name);
    return new Election(this, name);
  }

  /**
   * watch follows one lock ({lock}) or every lock under a prefix
   * ({prefix}, "" for all): an async iterator of changes. A lock's watch
   * starts with its current status (free or not), a prefix watch with every
   * lock under it that has state; then one change per committed change,
   * each lock's in log order (rising index). It rides the client's
   * WebSocket and survives reconnects and leader changes: nothing comes
   * twice or out of order, and a lock's latest state always comes
   * (changes made while the client was away may be folded into one,
   * marked resync). The iterator throws the server's refusal (a bad name,
   * no read access) and ends when options.signal aborts, when the loop
   * breaks, or when the client closes.
   */
  watch(options: WatchOptions): Watch {
    if (this.closed) throw new ClosedError();
    return new Watch(this, options);
  }

  /** status reads a lock's status (a linearizable read on the leader, over HTTP). */
  async status(name: string, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<LockStatus> {
    checkLockName(name);
    const r = await this.http.call("GET", lockPath(name), options);
    return toLockStatus(decodeBody<WireLockStatus>(r.text, lockStatusShape, "lock status"));
  }

  /**
   * revoke ends the grants of lock `name`, held by any client — every one,
   * or only the one with fencingToken — an admin operation (over HTTP). The
   * holders' signals abort with a RevokedError, lock-delays apply, waiters
   * are granted. It resolves with the tokens revoked (none for a lock
   * without holders); a token that names no current grant rejects with a
   * NotHolderError.
   */
  async revoke(name: string, fencingToken?: bigint, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<bigint[]> {
    checkLockName(name);
    if (fencingToken !== undefined && (typeof fencingToken !== "bigint" || fencingToken <= 0n)) {
      throw new InvalidArgumentError("lockd: revoke: fencingToken is a positive bigint");
    }
    const q = fencingToken === undefined ? "" : `?fencing_token=${fencingToken}`;
    const r = await this.http.call("DELETE", lockPath(name) + q, options);
    return decodeBody<WireRevokeReply>(r.text, revokeReplyShape, "revoke reply").revoked;
  }

  /**
   * close ends the client: it deletes the session on the server (which
   * releases every lock of the session and drops its waits, in one step),
   * aborts every lock's signal with a ClosedError, rejects pending
   * acquires with a ClosedError, ends the watches, and closes the
   * connection. The clean-up on the server is bounded by closeTimeoutMs;
   * if it fails, close rejects (the session still ends by itself after
   * its TTL).
   */
  close(): Promise<void> {
    if (!this.closing) this.closing = this.doClose();
    return this.closing;
  }

  private async doClose(): Promise<void> {
    this.closed = true;
    this.connChanged.notify(); // wakes waitConn, which sees closed
    this.relChanged.notify();
    const closedErr = new ClosedError();
    for (const l of [...this.locks.values()]) l.lose(closedErr);
    for (const op of new Set(this.ops.values())) this.finish(op, undefined, closedErr);
    for (const w of [...this.watches]) w.end(closedErr);
    const ids = this.orphans;
    this.orphans = [];
    const s = this.sess;
    if (s && !s.lost) {
      s.lost = true;
      s.err = closedErr;
      s.ac.abort(closedErr);
      if (!s.readOnly) ids.push(s.id);
    }
    if (this.cur) this.http.setLeader(this.cur.base);
    const errs: unknown[] = [];
    const deadline = AbortSignal.timeout(this.cfg.closeTimeoutMs);
    for (const id of ids) {
      try {
        await this.deleteSession(id, deadline);
      } catch (e) {
        errs.push(e);
      }
    }
    this.closeAc.abort();
    if (this.cur) this.kill(this.cur, "");

    clearTimeout(this.leaseTimer);
    this.leaseTimer = undefined;
    const bound = new AbortController();
    await Promise.race([Promise.allSettled([...this.background]), sleep(this.cfg.closeTimeoutMs, bound.signal)]);
    bound.abort();
    this.http.close();
    if (errs.length > 0) {
      throw new LockdError(`lockd: deleting the session on close: ${errs.map(describe).join("; ")} (it ends by itself after its TTL)`, { code: "close", cause: errs[0] });
    }
  }

  /** deleteSession deletes session id over HTTP; a session already gone is fine. */
  private async deleteSession(id: string, signal: AbortSignal): Promise<void> {
    try {
      await this.http.call("DELETE", "/api/v1/sessions/" + encodeURIComponent(id), { signal, timeoutMs: this.cfg.closeTimeoutMs });
    } catch (e) {
      if (e instanceof LockdError && (e.code === "session_expired" || e.code === "not_found")) return;
      throw e;
    }
  }

  // --- internals ---

  /** @internal */
  log(level: "debug" | "info" | "warn", msg: string, fields?: Record<string, unknown>): void {
    this.cfg.logger[level]?.(msg, fields);
  }

  /** @internal */
  nextId(): number {
    return ++this.ids;
  }

  /** @internal spawn runs a background task the client owns; close waits for it (bounded). */
  spawn(p: Promise<unknown>): void {
    const q = p.catch((e) => this.log("warn", "lockd: background task failed", { err: describe(e) }));
    this.background.add(q);
    void q.finally(() => this.background.delete(q));
  }

  /** @internal The current live connection, if any. */
  get current(): Conn | undefined {
    return this.cur;
  }

  // --- the connection ---

  /**
   * connectLoop finds the leader and establishes (or resumes) the session,
   * in rounds over the endpoints with backoff, until signal aborts. When
   * first is set (Client.connect), a refused token, a redirect refused for
   * good or an HTTPS-only member ends it at once; a reconnect keeps trying,
   * since the token may be accepted again after a reload, and the
   * session's lease decides meanwhile.
   */
  private async connectLoop(first: boolean, signal: AbortSignal): Promise<Conn> {
    const bo = new Backoff(this.cfg.minBackoffMs, this.cfg.maxBackoffMs);
    let last: unknown;
    for (;;) {
      let wait = 0;
      for (const base of this.http.candidates()) {
        let target: string | undefined = base;
        for (let hop = 0; hop <= maxLeaderHops && target && !signal.aborted; hop++) {
          const r = await this.tryMember(target, signal);
          if (r.conn) return r.conn;
          last = r.err;
          if (r.err instanceof ClosedError) throw r.err;
          const fatal = (r.err instanceof LockdError && isAuthError(r.err)) || (r.err instanceof UntrustedRedirectError && r.err.fatal) || r.err instanceof HTTPSRequiredError;
          if (first && fatal) throw r.err;
          if (r.err instanceof LockdError && r.err.retryAfterMs !== undefined) wait = Math.max(wait, r.err.retryAfterMs);
          if (fatal) break;
          target = r.next;
        }
        if (signal.aborted) break;
      }
      wait = Math.max(wait, bo.next());
      this.log(first ? "debug" : "info", "lockd: no leader reachable, retrying", { err: describe(last), wait });
      if (signal.aborted || !(await sleep(wait, signal))) {
        if (this.closed) throw new ClosedError();
        throw new NoLeaderError(`lockd: no_leader: no member led to a leader${first && this.cfg.dialTimeoutMs > 0 ? ` within ${this.cfg.dialTimeoutMs} ms (dialTimeoutMs)` : ""}; last error: ${describe(last)}`, { cause: last });
      }
    }
  }

  /** tryMember connects to the member at base and establishes the session there; or says where to go next, or why not. */
  private async tryMember(base: string, signal: AbortSignal): Promise<{ conn?: Conn; next?: string; err?: unknown }> {
    const link = linked([signal], this.cfg.attemptTimeoutMs);
    try {
      return await this.tryMemberWithin(base, link.signal);
    } finally {
      link.dispose();
    }
  }

  private async tryMemberWithin(base: string, attempt: AbortSignal): Promise<{ conn?: Conn; next?: string; err?: unknown }> {
    let ws: WebSocket;
    try {
      ws = await openSocket(wsURL(base), this.cfg, attempt);
    } catch (e) {
      if (!(e instanceof UpgradeRefused)) {
        return { err: new Error(`lockd: ${base}: ${describe(e)}`, { cause: e }) };
      }
      const hdr = (k: string) => {
        const v = e.headers[k];
        return Array.isArray(v) ? v[0] : v;
      };
      switch (e.status) {
        case 307:
        case 308:
          try {
            const t = this.http.trust.redirectTarget(new URL(base + "/api/v1/ws"), hdr("x-lockd-leader"), hdr("location"));
            return { next: t.leader, err: new Error(`lockd: ${base}: redirected to the leader ${t.leader}`) };
          } catch (he) {
            return { err: he };
          }
        case 400:
          if (e.body.includes("Client sent an HTTP request to an HTTPS server")) {
            return { err: new HTTPSRequiredError(`lockd: ${base}: this member speaks HTTPS: use an https:// endpoint, and trust its CA (tls.ca)`) };
          }
      }
      return { err: errorFromReply(e.status, e.body, e.headers) };
    }

    if (this.closed) {
      ws.terminate();
      return { err: new ClosedError() };
    }
    const conn = new Conn(ws, base, this);
    const s = this.sess;
    const resume = s !== undefined && !s.lost && !s.readOnly;
    const hello = encodeRequest("hello", this.nextId(), {
      client_id: this.clientId,
      session_ttl_ms: this.cfg.sessionTtlMs,
      session_id: resume ? s.id : undefined,
    });
    const sentAt = now();
    let m: ServerFrame;
    try {
      conn.send(hello);
      m = await raceSignal(conn.first.promise, attempt); // teardown rejects it if the connection closes first
    } catch (e) {
      ws.terminate();
      return { err: new Error(`lockd: ${base}: hello: ${describe(e)}`, { cause: e }) };
    }
    if (m.type === "error") {
      ws.terminate();
      const err = serverError(m.error?.code ?? "internal", m.error?.message ?? "", { leader: m.leader, retryAfterMs: m.retry_after_ms });
      if (err.code === "not_leader" && m.leader) {
        const herr = this.http.trust.leaderHop(base, m.leader, true);
        if (herr) return { err: herr };
        return { next: m.leader, err };
      }
      if (err.code === "session_expired" && resume && s) {
        this.log("warn", "lockd: session expired while disconnected", { session: s.id });
        this.sessionLost(s, new SessionExpiredError(`lockd: session ${s.id} ended on the server before it could be resumed`), false);
        return { next: base, err };
      }
      return { err };
    }
    const readOnly = m.read_only === true;
    if (m.type !== "hello" || !m.session_id === !readOnly) {
      ws.terminate();
      return { err: new Error(`lockd: ${base}: hello: unexpected reply ${m.type}`) };
    }
    if (this.closed) {
      ws.terminate();
      if (!resume && m.session_id) await this.deleteSession(m.session_id, AbortSignal.timeout(this.cfg.closeTimeoutMs)).catch(() => {});
      return { err: new ClosedError() };
    }
    if (readOnly) {
      // The token has read access only: no session, no lease. The
      // connection serves watches; the server refuses acquires.
      if (resume) {
        this.sessionLost(s, new PermissionDeniedError(`lockd: the token has read access only now: session ${s.id} cannot go on`), false);
      }
      if (!this.sess || this.sess.lost || !this.sess.readOnly) this.sess = Session.readOnlySession();
    } else if (resume && (this.sess !== s || s.lost)) {
      // The local lease ran out during the hello: the session was given up
      // (and will be deleted); start over with a fresh one.
      ws.terminate();
      return { next: base, err: new Error("lockd: the session was lost during the resume") };
    } else if (resume) {
      s.setTtl(m.session_ttl_ms);
    } else {
      if (s && s.readOnly && !s.lost) {
        // The token gained lock access: the client has a session now.
        s.lost = true;
        s.err = new ClosedError("lockd: the read-only connection was replaced by one with a session");
        s.ac.abort(s.err);
      }
      const ttl = m.session_ttl_ms ?? this.cfg.sessionTtlMs;
      this.sess = new Session(m.session_id!, ttl, sentAt + ttl);
    }
    this.armLease();
    const sess = this.sess!;
    this.http.setLeader(base);
    if (readOnly) this.log("info", "lockd: read-only connection established (the token has read access only: watches, no session)", { leader: base });
    else this.log("info", "lockd: session established", { leader: base, session: m.session_id, resumed: resume });

    // Sessions given up locally may still hold locks on the server under
    // this client id; end them before the new session can acquire anything.
    // (A read token may not delete them, and its connection acquires
    // nothing: they wait for a connection with a session.)
    const orphans = readOnly ? [] : this.orphans;
    if (!readOnly) this.orphans = [];
    for (let i = 0; i < orphans.length; i++) {
      try {
        await this.deleteSession(orphans[i]!, attempt);
      } catch (e) {
        this.orphans.push(...orphans.slice(i));
        ws.terminate();
        return { err: new Error(`lockd: deleting abandoned session ${orphans[i]}: ${describe(e)}`, { cause: e }) };
      }
    }
    if (conn.closed || this.closed) {
      ws.terminate();
      return { err: this.closed ? new ClosedError() : new ConnLostError("the connection closed during the set-up") };
    }
    conn.sess = sess;
    conn.resumed = resume;
    this.install(conn);
    return { conn };
  }

  /** install makes conn the live connection, re-sends the pending acquires and the watches on it, and starts its keepalives. */
  private install(conn: Conn): void {
    this.cur = conn;
    conn.installed = true;
    this.connChanged.notify();
    for (const m of conn.takeEarly()) {
      if (this.cur === conn) this.dispatch(conn, m);
    }
    if (this.cur !== conn) return;
    if (conn.resumed) this.spawn(this.recheck(conn));
    const readOnly = conn.sess!.readOnly;
    for (const op of new Set(this.ops.values())) {
      const f = this.prepAcquire(op, false);
      if (f && !conn.send(f)) return;
      if (f && op.abandoned) this.sendCancel(op);
    }
    for (const w of this.watches) {
      const f = w.frameFor(conn);
      if (f && !conn.send(f)) return;
    }
    if (!readOnly) this.spawn(this.keepalive(conn));
  }

  /** run serves the connections one after another until close. */
  private async run(conn: Conn): Promise<void> {
    const bo = new Backoff(this.cfg.minBackoffMs, this.cfg.maxBackoffMs);
    for (;;) {
      const start = now();
      await conn.done.promise;
      if (this.closed) return;
      this.log("info", "lockd: connection lost", { leader: conn.base });
      // A connection that died young (a member that accepts and drops)
      // must not turn this into a busy loop.
      if (now() - start < 1000) {
        if (!(await sleep(bo.next(), this.closeAc.signal))) return;
      } else {
        bo.reset();
      }
      try {
        conn = await this.connectLoop(false, this.closeAc.signal);
      } catch {
        return; // closed
      }
    }
  }

  /** @internal teardown forgets conn and fails the calls waiting on it. */
  teardown(conn: Conn): void {
    if (conn.closed) return;
    conn.closed = true;
    if (this.cur === conn) {
      this.cur = undefined;
      this.connChanged.notify();
    }
    conn.ac.abort();
    const lost = new ConnLostError("lockd: connection lost");
    for (const d of conn.calls.values()) d.reject(lost);
    conn.calls.clear();
    conn.first.reject(lost);
    conn.done.resolve();
  }

  /** @internal kill stops using conn; its close then tears it down. */
  kill(conn: Conn, why: string): void {
    if (why) this.log("info", "lockd: dropping connection", { leader: conn.base, why });
    this.teardown(conn);
    conn.ws.terminate();
  }

  /**
   * @internal exchange sends a request on conn and waits for its reply.
   * sentAt is taken before the write: the start of any lease the reply
   * confirms.
   */
  async exchange<K extends RequestKind>(conn: Conn, kind: K, fields: RequestFields<K>, signal?: AbortSignal): Promise<RoundTrip> {
    if (conn.closed || this.cur !== conn) return { sentAt: 0, err: new ConnLostError("lockd: connection lost") };
    const id = this.nextId();
    const d = deferred<ServerFrame>();
    conn.calls.set(id, d);
    const text = encodeRequest(kind, id, fields);
    const sentAt = now();
    if (!conn.send(text)) {
      conn.calls.delete(id);
      return { sentAt: 0, err: new ConnLostError("lockd: connection lost") };
    }
    try {
      return { m: await raceSignal(d.promise, signal), sentAt };
    } catch (e) {
      return { sentAt, err: e };
    } finally {
      conn.calls.delete(id);
    }
  }

  /** @internal waitConn waits for a live connection of session s (any session if s is undefined). */
  async waitConn(s: Session | undefined, signal?: AbortSignal): Promise<Conn> {
    for (;;) {
      if (this.closed) throw new ClosedError();
      if (s?.lost) throw s.err;
      if (this.cur && (s === undefined || this.sess === s)) return this.cur;
      await raceSignal(this.connChanged.wait(), signal); // close() notifies too
    }
  }

  /**
   * @internal roundTrip sends a request within session s and waits for its
   * reply, again on the next connection if the current one is lost first,
   * and again after a pause when the member is overloaded. sentAt is the
   * send time of the request the reply answers; with an error, that of the
   * first send (0 if nothing was sent): the server may have applied it.
   */
  async roundTrip<K extends RequestKind>(s: Session | undefined, kind: K, fields: RequestFields<K>, signal?: AbortSignal): Promise<RoundTrip> {
    let first = 0;
    const bo = new Backoff(this.cfg.minBackoffMs, this.cfg.maxBackoffMs);
    for (;;) {
      let conn: Conn;
      try {
        conn = await this.waitConn(s, signal);
      } catch (e) {
        return { sentAt: first, err: e };
      }
      const r = await this.exchange(conn, kind, fields, signal);
      if (first === 0) first = r.sentAt;
      if (r.err instanceof ConnLostError) continue;
      if (r.err !== undefined) return { sentAt: first, err: r.err };
      const m = r.m!;
      if (m.type === "error" && m.error) {
        switch (m.error.code) {
          case "not_leader":
          case "no_leader":
            // The member lost the leadership: find the new leader.
            this.kill(conn, "leadership lost");
            continue;
          case "overloaded": {
            const wait = Math.max(bo.next(), m.retry_after_ms ?? 0);
            this.log("info", "lockd: the leader is overloaded, retrying", { op: kind, wait });
            const link = linked([signal, this.closeAc.signal]);
            const slept = await sleep(wait, link.signal);
            link.dispose();
            if (!slept) return { sentAt: first, err: signal?.aborted ? signal.reason : new ClosedError() };
            continue;
          }
          case "session_expired":
            if (s) this.sessionLost(s, new SessionExpiredError("lockd: the server ended the session"), false);
        }
      }
      return { m, sentAt: r.sentAt };
    }
  }

  /** keepalive sends a keepalive every third of the session TTL (at once after a resume) and drops the connection when one goes unanswered for that long. */
  private async keepalive(conn: Conn): Promise<void> {
    const s = conn.sess!;
    let delay = conn.resumed ? 0 : s.ttlMs / 3;
    const bo = new Backoff(this.cfg.minBackoffMs, this.cfg.maxBackoffMs);
    for (;;) {
      if (!(await sleep(delay, conn.ac.signal))) return;
      const iv = s.ttlMs / 3;
      const r = await this.exchange(conn, "keepalive", {}, AbortSignal.timeout(iv));
      if (r.err !== undefined || !r.m) {
        if (!conn.closed && (r.err as Error)?.name === "TimeoutError") this.kill(conn, "keepalive unanswered");
        return;
      }
      const m = r.m;
      if (m.type === "ok") {
        this.confirmSession(s, r.sentAt, m.session_ttl_ms);
        bo.reset();
        delay = Math.max(0, r.sentAt + iv - now());
        continue;
      }
      const code = m.error?.code ?? "";
      if (code === "session_expired") {
        this.log("warn", "lockd: session expired on the server", { session: s.id });
        this.sessionLost(s, new SessionExpiredError(`lockd: session ${s.id} ended on the server`), false);
        return;
      }
      if (code === "overloaded") {
        // Keepalives are admitted before new work, so this is rare; ask
        // again soon, well within the lease.
        delay = Math.min(Math.max(bo.next(), m.retry_after_ms ?? 0), iv / 3);
        continue;
      }
      this.kill(conn, `keepalive: ${code}`);
      return;
    }
  }

  /** @internal dispatch handles one server frame of the live connection. */
  dispatch(conn: Conn, m: ServerFrame): void {
    if (this.cur !== conn || this.closed) return;
    if (m.id) {
      const call = conn.calls.get(m.id);
      if (call) {
        conn.calls.delete(m.id);
        call.resolve(m);
        return;
      }
      const w = conn.watchReqs.get(m.id);
      if (w) {
        conn.watchReqs.delete(m.id);
        w.onReply(conn, m);
        return;
      }
      if (conn.unwatches.delete(m.id)) return;
    }
    switch (m.type) {
      case "changed":
        conn.watchIds.get(m.watch_id!)?.onChanged(m);
        return;
      case "synced":
        conn.watchIds.get(m.watch_id!)?.onSynced(m);
        return;
      case "resync": {
        const w = conn.watchIds.get(m.watch_id!);
        if (w) {
          this.log("info", "lockd: the server dropped changes for a watch; reading it again", { watch: w.what });
          w.resync();
        }
        return;
      }
      case "granted":
        this.onGranted(conn, m);
        return;
      case "lost":
        this.onLost(m);
        return;
      case "error": {
        const op = m.id ? this.opById.get(m.id) : undefined;
        if (op) {
          this.onAcquireError(conn, op, m);
          return;
        }
        const code = m.error?.code ?? "";
        if (m.id && (code === "cancelled" || code === "wait_timeout" || code === "lock_held")) {
          // The answer to an earlier send of an acquire that was answered
          // already (the end of a wait answers every acquire that joined it).
          this.log("debug", "lockd: an answer to an acquire sent before", { code, id: m.id });
          return;
        }
        switch (code) {
          case "session_expired":
            if (this.sess) this.sessionLost(this.sess, new SessionExpiredError("lockd: the server ended the session"), false);
            return;
          case "not_leader":
          case "no_leader":
            if (m.leader) {
              const herr = this.http.trust.leaderHop(conn.base, m.leader, true);
              if (herr) this.log("warn", "lockd: not following the leader a member named", { err: herr.message });
              else this.http.setLeader(m.leader);
            }
            this.kill(conn, code);
            return;
          case "internal":
            this.kill(conn, "the member's event stream overflowed");
            return;
        }
        if (m.watch_id) {
          // The server ended that watch (a token reload took its access away).
          const w = conn.watchIds.get(m.watch_id);
          if (w) {
            conn.watchIds.delete(m.watch_id);
            w.fail(serverError(code, m.error?.message ?? "", { lock: m.lock }));
          }
          return;
        }
        this.log("warn", "lockd: unsolicited error from the server", { code, id: m.id });
      }
    }
  }

  /** @internal onMalformed handles a frame that did not decode: the request it answers, if it names one, fails. */
  onMalformed(conn: Conn, text: string, err: DecodeError): void {
    const idm = /"id"\s*:\s*(\d{1,15})\b/.exec(text);
    if (!idm) return;
    const rid = Number(idm[1]);
    const call = conn.calls.get(rid);
    if (call) {
      conn.calls.delete(rid);
      call.reject(err);
      return;
    }
    const op = this.opById.get(rid);
    if (op && !op.abandoned) this.finish(op, undefined, new LockdError(`lockd: acquire of ${describeNames(op.names)}: ${err.message}`, { code: "internal", cause: err }));
  }

  private onLost(m: ServerFrame): void {
    if (m.reason === "session_expired") {
      if (this.sess) this.sessionLost(this.sess, new SessionExpiredError(`lockd: the server ended the session (lock ${m.lock} lost)`, { lock: m.lock }), false);
      return;
    }
    const l = this.locks.get(m.lock!);
    if (!l || (m.fencing_token !== undefined && m.fencing_token !== l.fencingToken)) return;
    const what = `lock ${l.name} token ${l.fencingToken}`;
    switch (m.reason) {
      case "expired":
        l.lose(new LockExpiredError(`lockd: ${what}: its TTL ran out on the server`, { lock: l.name }));
        return;
      case "revoked":
        l.lose(new RevokedError(`lockd: ${what} was revoked`, { lock: l.name }));
        return;
      default:
        l.lose(new NotHolderError(`lockd: ${what} lost (${m.reason})`, { lock: l.name }));
    }
  }

  // --- sessions and leases ---

  private leaseEnd(deadline: number, ttl: number): number {
    return leaseEnd(deadline, ttl, this.cfg.leaseMarginMs);
  }

  /** @internal The local lease of a lock as a wall-clock Date. */
  lockLeaseEnd(l: Lock): Date {
    let d = this.leaseEnd(l.sess.deadline, l.sess.ttlMs);
    if (l.ttlMs > 0) d = Math.min(d, this.leaseEnd(l.deadline, l.ttlMs));
    return new Date(Date.now() + (d - now()));
  }

  /** @internal armLease declares lost whatever lease ran out and sets the timer for the next one. */
  armLease(): void {
    clearTimeout(this.leaseTimer);
    this.leaseTimer = undefined;
    if (this.closed) return;
    const t = now();
    let next = Infinity;
    const s = this.sess;
    if (s && !s.lost && !s.readOnly) {
      const end = this.leaseEnd(s.deadline, s.ttlMs);
      if (t >= end) {
        this.log("warn", "lockd: session lease ran out", { session: s.id, ttlMs: s.ttlMs });
        this.sessionLost(
          s,
          new LeaseExpiredError(`lockd: session ${s.id}: no keepalive sent in the last ${s.ttlMs} ms was confirmed by the leader, so the server may expire it`, {
            cause: new SessionExpiredError(`lockd: session ${s.id} expired (local lease)`),
          }),
          true,
        );
      } else {
        next = Math.min(next, end);
      }
    }
    for (const l of [...this.locks.values()]) {
      if (l.ttlMs <= 0) continue;
      const end = this.leaseEnd(l.deadline, l.ttlMs);
      if (t >= end) {
        this.log("warn", "lockd: lock lease ran out", { lock: l.name, token: String(l.fencingToken), ttlMs: l.ttlMs });
        l.lose(new LeaseExpiredError(`lockd: lock ${l.name} token ${l.fencingToken}: no acquire or renew sent in the last ${l.ttlMs} ms was confirmed`, { lock: l.name }));
      } else {
        next = Math.min(next, end);
      }
    }
    if (next !== Infinity) {
      this.leaseTimer = setTimeout(() => this.armLease(), Math.max(0, next - now()));
    }
  }

  /** @internal confirmSession moves the session's local lease after a confirmed keepalive sent at sentAt. */
  confirmSession(s: Session, sentAt: number, ttlMs: number | undefined): void {
    if (this.sess !== s || s.lost) return;
    s.setTtl(ttlMs);
    if (sentAt + s.ttlMs > s.deadline) s.deadline = sentAt + s.ttlMs;
    this.armLease();
  }

  /**
   * sessionLost ends session s: its locks are lost, its pending acquires
   * fail with cause, and the connection is dropped so that the next one
   * opens a fresh session. local says the server may still hold the
   * session (the local lease ran out), so it is deleted there before
   * anything else.
   */
  private sessionLost(s: Session, cause: LockdError, local: boolean): void {
    if (s.lost) return;
    s.lost = true;
    s.err = cause;
    s.ac.abort(cause);
    for (const l of [...this.locks.values()]) if (l.sess === s) l.lose(cause);
    for (const op of new Set(this.ops.values())) if (op.sess === s) this.finish(op, undefined, cause);
    if (local) this.orphans.push(s.id);
    if (this.cur) this.kill(this.cur, "session lost");
  }

  /** @internal serverEndedSession is told the server ended the current session. */
  serverEndedSession(): void {
    if (this.sess) this.sessionLost(this.sess, new SessionExpiredError("lockd: the server ended the session"), false);
  }

  /** @internal forgetLock drops a lost lock from the held locks. */
  forgetLock(l: Lock): void {
    if (this.locks.get(l.name) === l) this.locks.delete(l.name);
  }

  // --- acquire ---

  /** acquireNames takes names (one, or a multi-acquire's in name order). */
  private async acquireNames(names: string[], o: AcquireOpts, tryOnly: boolean): Promise<Lock[]> {
    const signal = o.signal;
    if (signal?.aborted) throw signal.reason;
    const start = now();
    let op: AcquireOp | undefined;
    while (!op) {
      if (this.closed) throw new ClosedError();
      let busy: Promise<unknown> | undefined;
      let releasing = false;
      let adopt: AcquireOp | undefined;
      let here: LockHeldError | undefined; // what a try says when busy is this client's own
      for (const name of names) {
        const l = this.locks.get(name);
        const p = this.ops.get(name);
        if (l) {
          busy = new Promise((r) => l.signal.addEventListener("abort", r, { once: true }));
          here = new LockHeldError(`lockd: lock ${name} is already held by this client (token ${l.fencingToken}): use the Lock you have, or release it first`, { lock: name, holder: this.clientId, byThisClient: true });
        } else if ((this.releasing.get(name) ?? 0) > 0) {
          // The server would answer with the grant being released (same
          // token), and the release would then end it.
          busy = this.relChanged.wait();
          releasing = true;
        } else if (p) {
          if (!p.abandoned || !sameNames(p.names, names)) {
            busy = p.done.promise.catch(() => {});
            here = new LockHeldError(`lockd: lock ${name} is already being acquired by this client, in another call`, { lock: name, holder: this.clientId, byThisClient: true });
          } else if (p.cancel === "sent" || p.cancel === "withdrawn") {
            // Being withdrawn: wait for that to settle, then start afresh.
            busy = Promise.race([p.done.promise.catch(() => {}), p.cancelChanged.wait()]);
            releasing = true;
          } else {
            adopt = p; // an abandoned wait: adopt it, it keeps its place
          }
        }
        if (busy) break;
      }
      if (!busy) {
        if (!adopt) {
          op = newOp(names, o);
          for (const n of names) this.ops.set(n, op);
        } else {
          op = adopt;
        }
        op.o = o;
        op.try = tryOnly;
        op.abandoned = false;
        op.cancel = "none";
        op.deadline = start + o.wait;
        const f = this.prepAcquire(op, true);
        if (f) this.cur!.send(f);
        break;
      }
      if (tryOnly && !releasing) throw here!;
      await raceSignal(busy, signal); // close() ends every one of them
    }

    // Whichever comes first — the answer, the caller's abort, the local
    // bound of an explicit wait — decides, in one callback: a grant the
    // caller did not take is released, never handed out and released both.
    const theOp = op;
    return new Promise<Lock[]>((resolve, reject) => {
      let settled = false;
      let timer: NodeJS.Timeout | undefined;
      const settle = (f: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        f();
      };
      const onAbort = () =>
        settle(() => {
          this.abandon(theOp);
          reject(signal!.reason);
        });
      theOp.done.promise.then(
        (ls) => settle(() => resolve(ls)),
        (e) => settle(() => reject(e)),
      );
      if (o.waitSet && !tryOnly) {
        timer = setTimeout(
          () =>
            settle(() => {
              this.abandon(theOp);
              reject(new WaitTimeoutError(`lockd: wait_timeout: ${describeNames(names)}: no answer from the leader within the wait`, { lock: names[0] }));
            }),
          Math.max(0, theOp.deadline - now()) + waitSlackMs,
        );
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      if (signal?.aborted) onAbort();
    });
  }

  /**
   * abandon gives up on op for its caller. A lock it already got is
   * released; a wait still queued on the server is withdrawn (cancel), and
   * a grant that comes meanwhile is released.
   */
  private abandon(op: AcquireOp): void {
    if (op.finished) {
      if (op.done.settled) {
        op.done.promise.then(
          (ls) => {
            for (const l of ls) if (!l.lost) this.releaseLater(l);
          },
          () => {},
        );
      }
      return;
    }
    op.abandoned = true;
    if (op.sends === 0) {
      // Never sent (no connection meanwhile): nothing on the server to
      // withdraw or to learn about.
      this.finish(op, undefined, new CancelledError(`lockd: the acquire of ${describeNames(op.names)} was given up before it was sent`, { code: "cancelled" }));
      return;
    }
    this.sendCancel(op);
  }

  /** sendCancel withdraws an abandoned op's queued wait on the live connection it was sent on. */
  private sendCancel(op: AcquireOp): void {
    const conn = this.cur;
    if (!conn || op.conn !== conn || op.finished || op.cancel === "unsupported") return;
    op.cancel = "sent";
    const fields = op.names.length > 1 ? { locks: op.names } : { lock: op.names[0]! };
    this.spawn(
      (async () => {
        const r = op.names.length > 1 ? await this.exchange(conn, "cancelMany", fields as { locks: string[] }) : await this.exchange(conn, "cancel", fields as { lock: string });
        if (op.cancel !== "sent") return;
        const m = r.m;
        if (!m) {
          op.cancel = "none"; // the connection went; the next one asks again
        } else if (m.type === "ok") {
          op.cancel = m.cancelled ? "withdrawn" : "notQueued";
        } else if (m.error?.code === "not_leader" || m.error?.code === "no_leader" || m.error?.code === "overloaded") {
          op.cancel = "none";
        } else {
          // A server without cancel (or that refused it): the wait stays
          // queued until answered; its grant is then released.
          this.log("info", "lockd: the server did not withdraw an abandoned wait; its grant, if any, will be released", { lock: op.names.join(","), code: m.error?.code });
          op.cancel = "unsupported";
        }
        op.cancelChanged.notify();
      })(),
    );
  }

  /**
   * prepAcquire gives op a new request id and returns its frame for the
   * live connection, or undefined when there is none (the next connection
   * will send it), op was already sent on it and force is false, or op is
   * granted already.
   */
  private prepAcquire(op: AcquireOp, force: boolean): string | undefined {
    const conn = this.cur;
    const s = this.sess;
    if (!conn || !s || s.lost || op.confirming || op.finished || (op.conn === conn && !force)) return undefined;
    this.opById.delete(op.reqId);
    op.reqId = this.nextId();
    this.opById.set(op.reqId, op);
    op.resent = op.resent || (op.conn !== undefined && op.conn !== conn);
    op.conn = conn;
    op.sess = s;
    const t = now();
    op.sentAt = t;
    op.sends++;
    let wait: number;
    if (op.try) {
      wait = 0;
    } else if (op.abandoned) {
      wait = op.serverDeadline - t; // keeps the place until the withdrawal that follows
    } else if (op.o.waitSet) {
      wait = op.deadline - t;
    } else {
      wait = limits.maxWaitTimeoutMs;
    }
    wait = Math.floor(Math.min(Math.max(wait, 0), limits.maxWaitTimeoutMs));
    op.serverDeadline = t + wait;
    const o = op.o;
    const common = {
      wait_timeout_ms: wait,
      mode: o.mode,
      value: o.value,
      ttl_ms: o.ttlMs > 0 ? o.ttlMs : undefined,
      lock_delay_ms: o.lockDelayMs > 0 ? o.lockDelayMs : undefined,
    };
    if (o.ttlMs > 0) op.lastTtl = o.ttlMs;
    if (op.names.length > 1) return encodeRequest("acquireMany", op.reqId, { ...common, locks: op.names });
    return encodeRequest("acquire", op.reqId, { ...common, lock: op.names[0]!, limit: o.limit > 0 ? o.limit : undefined });
  }

  /** finish resolves op. */
  private finish(op: AcquireOp, locks: Lock[] | undefined, err: unknown): void {
    for (const n of op.names) if (this.ops.get(n) === op) this.ops.delete(n);
    this.opById.delete(op.reqId);
    if (op.finished) return;
    op.finished = true;
    op.cancelChanged.notify();
    if (locks) {
      op.done.resolve(locks);
      if (op.abandoned) for (const l of locks) this.releaseLater(l);
    } else {
      op.done.reject(err);
    }
  }

  /**
   * onGranted takes a grant for a pending acquire. The lock's lease is
   * what the server granted, never what the caller asked for: a grant
   * without expires_at has no TTL of its own (the session's lease covers
   * it); one with expires_at has the TTL the server holds, which the client
   * knows only when the grant answers the one request this wait ever sent,
   * with a TTL (the server counts it from the commit, after the send). In
   * every other case — a wait re-sent after a reconnect or adopted by a
   * later acquire, a grant pushed under a later request than the one it
   * answers, a late grant whose lease is mostly spent — a renew with an
   * explicit TTL confirms the lease before the lock is handed out.
   */
  private onGranted(conn: Conn, m: ServerFrame): void {
    const gs = m.grants ?? [{ lock: m.lock!, fencing_token: m.fencing_token!, expires_at: m.expires_at ?? "", mode: m.mode ?? "", fencing_proof: m.fencing_proof }];
    const names = gs.map((g) => g.lock).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    let op = m.id ? this.opById.get(m.id) : undefined;
    if (!op) op = this.ops.get(names[0]!); // a grant answering an earlier request of the same wait
    if (!op || !sameNames(op.names, names) || op.finished) {
      for (const g of gs) {
        const l = this.locks.get(g.lock);
        if (l && l.fencingToken === g.fencing_token) continue; // a repeat of a grant we hold
        // A grant nobody waits for (its wait was given up): hand it back.
        this.releaseLater(new Lock(this, conn.sess!, g.lock, g.fencing_token, undefined, "exclusive", undefined));
      }
      return;
    }
    if (op.confirming) return; // a repeat of the grant being confirmed
    const theOp = op;
    const locks: Lock[] = [];
    let withTtl = false;
    for (const name of theOp.names) {
      const g = gs.find((x) => x.lock === name)!;
      const exp = g.expires_at ? new Date(g.expires_at) : undefined;
      const hasExp = exp !== undefined && !Number.isNaN(exp.getTime());
      withTtl = withTtl || hasExp;
      const mode = (g.mode || m.mode || theOp.o.mode || "exclusive") as "exclusive" | "shared";
      const l = new Lock(this, theOp.sess!, g.lock, g.fencing_token, g.fencing_proof, mode, hasExp ? exp : undefined);
      l.val = theOp.o.value;
      locks.push(l);
    }
    if (locks.length > 1) for (const l of locks) l.group = locks;
    if (!withTtl || theOp.abandoned) {
      // Bound to the session only; or released at once.
    } else if (theOp.sends === 1 && theOp.o.ttlMs > 0 && m.id === theOp.reqId && now() - theOp.sentAt <= theOp.o.ttlMs / 2) {
      for (const l of locks) {
        if (l.expires) {
          l.ttlMs = theOp.o.ttlMs;
          l.deadline = theOp.sentAt + theOp.o.ttlMs;
        }
      }
    } else {
      // Wanted without a TTL but granted with one: keep the TTL the server
      // most likely holds (renewed automatically).
      const ttl = theOp.o.ttlMs || theOp.lastTtl || theOp.sess!.ttlMs;
      theOp.confirming = true;
      this.opById.delete(theOp.reqId);
      this.spawn(this.confirmLease(theOp, locks, ttl));
      return;
    }
    this.grant(theOp, locks);
  }

  /**
   * confirmLease renews locks, just granted to op, with an explicit ttl and
   * hands them out with the lease the answers confirm: from each renew's
   * send time, for ttl. When one lock of a multi-acquire cannot be
   * confirmed, the others are released.
   */
  private async confirmLease(op: AcquireOp, locks: Lock[], ttl: number): Promise<void> {
    const got: Array<{ sentAt: number; exp: Date | undefined; proof: string | undefined }> = [];
    let err: unknown;
    for (const l of locks) {
      const r = await this.roundTrip(op.sess, "renew", { lock: l.name, fencing_token: l.fencingToken, ttl_ms: ttl }, this.closeAc.signal);
      if (r.err !== undefined || !r.m) {
        err = r.err;
      } else if (r.m.type === "ok") {
        const exp = r.m.expires_at ? new Date(r.m.expires_at) : undefined;
        got.push({ sentAt: r.sentAt, exp: exp && !Number.isNaN(exp.getTime()) ? exp : undefined, proof: r.m.fencing_proof });
        continue;
      } else {
        err = serverError(r.m.error?.code ?? "internal", `lock ${l.name} was granted (token ${l.fencingToken}) but lost before its lease was confirmed: ${r.m.error?.message ?? ""}`, { lock: l.name });
      }
      break;
    }
    if (op.finished) return; // ended meanwhile: the session was lost, or the client closed
    if (err !== undefined) {
      if (locks.length > 1 && !op.sess!.lost) for (const l of locks) this.releaseLater(l);
      this.finish(op, undefined, err);
      return;
    }
    locks.forEach((l, i) => {
      l.ttlMs = ttl;
      l.deadline = got[i]!.sentAt + ttl;
      if (got[i]!.exp) l.expires = got[i]!.exp;
      if (got[i]!.proof) l.proof = got[i]!.proof;
    });
    this.grant(op, locks);
  }

  /** grant hands locks to op's caller, or releases them if op was abandoned. */
  private grant(op: AcquireOp, locks: Lock[]): void {
    if (!op.abandoned) {
      for (const l of locks) {
        this.locks.set(l.name, l);
        if (l.ttlMs > 0 && (op.o.autoRenew || op.o.ttlMs === 0)) this.spawn(this.autoRenew(l));
      }
      this.armLease();
    }
    this.finish(op, locks, undefined);
  }

  private onAcquireError(conn: Conn, op: AcquireOp, m: ServerFrame): void {
    const code = m.error?.code ?? "internal";
    const details = { lock: m.lock, holder: m.holder, leader: m.leader, retryAfterMs: m.retry_after_ms };
    let err: LockdError = serverError(code, m.error?.message ?? "", details);
    switch (code) {
      case "session_expired":
        this.sessionLost(op.sess!, new SessionExpiredError("lockd: the server ended the session"), false);
        return;
      case "not_leader":
      case "no_leader":
        this.kill(conn, code); // re-sent to the next leader
        return;
      case "overloaded": {
        // Refused before it was queued: send it again after the pause the
        // server asked for (and at least a growing backoff).
        op.overloadBackoff ??= new Backoff(this.cfg.minBackoffMs, this.cfg.maxBackoffMs);
        const wait = Math.max(op.overloadBackoff.next(), m.retry_after_ms ?? 0);
        const reqId = op.reqId;
        this.log("info", "lockd: the leader is overloaded; sending the acquire again", { lock: op.names.join(","), wait });
        this.spawn(
          sleep(wait, this.closeAc.signal).then((ok) => {
            if (!ok || op.finished || op.reqId !== reqId || this.cur !== conn) return; // a new connection sent it already
            const f = this.prepAcquire(op, true);
            if (f) conn.send(f);
          }),
        );
        return;
      }
      case "wait_timeout":
        if (!op.abandoned && !op.o.waitSet && !op.try) {
          // Without waitTimeoutMs the wait goes on: queue it again.
          const f = this.prepAcquire(op, true);
          if (f) conn.send(f);
          return;
        }
        break;
      case "lock_held":
        if (!op.try && !op.abandoned) {
          // A resend after a reconnect with no wait time left found it held.
          err = new WaitTimeoutError(`lockd: wait_timeout: ${describeNames(op.names)} (${err.message})`, { ...details, cause: err });
        }
        break;
      case "cancelled":
        if (op.abandoned) err = new CancelledError(`lockd: cancelled: the wait for ${describeNames(op.names)} was withdrawn`, { code, lock: op.names[0] });
        break;
    }
    if (op.resent && (code === "lock_held" || code === "wait_timeout")) {
      err = new (err.constructor as new (msg: string, d: object) => LockdError)(err.message + " (an earlier send may have been granted and lost while the client was away)", {
        ...details,
        code: err.code,
        cause: err.cause,
        maybeGrantedLost: true,
        holder: m.holder,
      });
    }
    this.finish(op, undefined, err);
  }

  /**
   * @internal releaseLater releases l in the background, bounded by
   * closeTimeoutMs: a grant nobody will use, or a lock whose release had
   * no answer. Until it ends, an acquire of the same name waits: the
   * server would answer it with this very grant.
   */
  releaseLater(l: Lock): void {
    if (this.closed) return; // deleting the session releases it
    this.releasing.set(l.name, (this.releasing.get(l.name) ?? 0) + 1);
    this.spawn(
      (async () => {
        try {
          const link = linked([this.closeAc.signal], this.cfg.closeTimeoutMs);
          const r = await this.roundTrip(l.sess, "release", { lock: l.name, fencing_token: l.fencingToken }, link.signal);
          link.dispose();
          if (r.m?.type === "ok") {
            l.lose(new ReleasedError(`lockd: lock ${l.name} token ${l.fencingToken} released`, { lock: l.name }));
          } else if (r.err !== undefined && !this.closed) {
            this.log("info", "lockd: releasing in the background", { lock: l.name, token: String(l.fencingToken), err: describe(r.err) });
          }
        } finally {
          const n = (this.releasing.get(l.name) ?? 1) - 1;
          if (n <= 0) this.releasing.delete(l.name);
          else this.releasing.set(l.name, n);
          this.relChanged.notify();
        }
      })(),
    );
  }

  /** autoRenew renews l every third of its TTL until it is lost or released. */
  private async autoRenew(l: Lock): Promise<void> {
    const ttl = l.ttlMs;
    let next = ttl / 3;
    const stop = linked([l.signal, this.closeAc.signal]);
    try {
      for (;;) {
        if (!(await sleep(next, stop.signal))) return;
        const bound = linked([stop.signal], ttl / 3);
        try {
          await l.renew(ttl, { signal: bound.signal });
          next = ttl / 3;
        } catch (e) {
          if (l.lost) return;
          this.log("info", "lockd: auto-renew failed, retrying", { lock: l.name, err: describe(e) });
          next = Math.max(ttl / 10, 10);
        } finally {
          bound.dispose();
        }
      }
    } finally {
      stop.dispose();
    }
  }

  // --- after a resume ---

  /**
   * recheck runs after the session was resumed on conn (a reconnect,
   * possibly to a new leader). While the client was away, a "lost" push or
   * the answer to a release or renew may have gone by unheard; so it asks
   * the leader about each lock it holds. A lock this client no longer holds
   * with its token is lost (NotHolderError). A TTL lock whose expiry the
   * leader reports earlier than the client knew has its local lease moved
   * earlier by as much. Locks are checked one at a time, in name order,
   * with linearizable reads, for at most the session's TTL.
   */
  private async recheck(conn: Conn): Promise<void> {
    const ls = [...this.locks.values()].filter((l) => l.sess === conn.sess && !l.lost).sort((a, b) => (a.name < b.name ? -1 : 1));
    const link = linked([this.closeAc.signal], conn.sess!.ttlMs);
    try {
      for (const l of ls) {
        if (l.lost) continue;
        try {
          await this.recheckLock(l, link.signal);
        } catch (e) {
          if (!this.closed) this.log("warn", "lockd: could not check a lock after resuming the session", { lock: l.name, token: String(l.fencingToken), err: describe(e) });
          if (link.signal.aborted) return;
        }
      }
    } finally {
      link.dispose();
    }
  }

  private async recheckLock(l: Lock, signal: AbortSignal): Promise<void> {
    const known = l.expires?.getTime();
    const r = await this.http.call("GET", lockPath(l.name), { signal, timeoutMs: this.cfg.sessionTtlMs });
    const st = toLockStatus(decodeBody<WireLockStatus>(r.text, lockStatusShape, "lock status"));
    let h = st.holders.find((x) => x.clientId === this.clientId && x.fencingToken === l.fencingToken);
    if (!h && st.holdersTotal > st.holders.length) {
      // More holders than a status lists: page to the one with our token.
      const q = await this.http.call("GET", `${lockPath(l.name, "holders")}?after=${l.fencingToken - 1n}&limit=1`, { signal, timeoutMs: this.cfg.sessionTtlMs });
      const page = decodeBody<WireHolderPage>(q.text, holderPageShape, "holders page");
      const w = page.holders[0];
      if (w && w.client_id === this.clientId && w.fencing_token === l.fencingToken) h = toHolder(w);
    }
    if (l.lost) return;
    if (!h) {
      this.log("warn", "lockd: a lock was lost while disconnected", { lock: l.name, token: String(l.fencingToken) });
      l.lose(new NotHolderError(`lockd: lock ${l.name} token ${l.fencingToken} is not held by this client any more (checked after the session resumed)`, { lock: l.name }));
      return;
    }
    const exp = h.expiresAt?.getTime();
    if (l.ttlMs === 0 && exp !== undefined) {
      // A TTL this client never set (another client with the same id
      // renewed it): nothing tells when it was counted from.
      l.lose(new LeaseExpiredError(`lockd: lock ${l.name} token ${l.fencingToken} has a TTL on the server that this client did not set, so its lease is unknown`, { lock: l.name }));
      return;
    }
    // Only against the expiry known when the read was sent: a renew
    // answered meanwhile has moved both.
    if (l.ttlMs > 0 && exp !== undefined && known !== undefined && l.expires?.getTime() === known && exp < known) {
      l.deadline += exp - known;
      l.expires = new Date(exp);
      this.armLease();
    }
  }
}
