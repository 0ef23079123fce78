// Backoff between retries, and sleeps that an AbortSignal ends.

/** Exponential backoff with jitter: each wait is drawn from [d/2, d], and d doubles up to max. */
export class Backoff {
  private cur = 0;
  constructor(
    private readonly min: number,
    private readonly max: number,
  ) {}

  next(): number {
    this.cur = this.cur === 0 ? this.min : Math.min(this.cur * 2, this.max);
    const half = this.cur / 2;
    return Math.round(half + Math.random() * half);
  }

  reset(): void {
    this.cur = 0;
  }
}

/**
 * sleep resolves after ms, or when signal aborts (then false): it reports
 * whether the whole time passed.
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  if (signal?.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      clearTimeout(t);
      signal?.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    const t = setTimeout(() => done(true), Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A promise with its resolve and reject at hand. */
export interface Deferred<T> {
  promise: Promise<T>;
  resolve: (v: T) => void;
  reject: (e: unknown) => void;
  settled: boolean;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const d: Deferred<T> = {
    promise: new Promise<T>((res, rej) => {
      resolve = res;
      reject = rej;
    }),
    resolve: (v) => {
      if (d.settled) return;
      d.settled = true;
      resolve(v);
    },
    reject: (e) => {
      if (d.settled) return;
      d.settled = true;
      reject(e);
    },
    settled: false,
  };
  // A rejection nobody awaits (an acquire abandoned by its caller) is not
  // an unhandled rejection of the process.
  d.promise.catch(() => {});
  return d;
}

/**
 * Notifier wakes everyone waiting for "something changed" (a new
 * connection, a background release ended): wait() resolves at the next
 * notify().
 */
export class Notifier {
  private d = deferred<void>();

  wait(): Promise<void> {
    return this.d.promise;
  }

  notify(): void {
    const d = this.d;
    this.d = deferred<void>();
    d.resolve();
  }
}

/**
 * raceSignal resolves as p does, or rejects with signal's reason when it
 * aborts first.
 */
export function raceSignal<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

/** A signal linked to others: see linked. */
export interface Linked {
  signal: AbortSignal;
  /** Unhooks it from its parents and clears its timer; call it when done. */
  dispose(): void;
}

/**
 * linked returns a signal that aborts when any of parents does (with its
 * reason) or, with ms, after ms (with a TimeoutError). Unlike
 * AbortSignal.any it can be unhooked from long-lived parents (the client's
 * own, a caller's) once done with, so that calls made in a loop over hours
 * leave nothing behind on them.
 */
export function linked(parents: Array<AbortSignal | undefined>, ms?: number): Linked {
  const ac = new AbortController();
  const hooks: Array<[AbortSignal, () => void]> = [];
  let timer: NodeJS.Timeout | undefined;
  const dispose = () => {
    for (const [p, f] of hooks) p.removeEventListener("abort", f);
    hooks.length = 0;
    clearTimeout(timer);
  };
  for (const p of parents) {
    if (!p) continue;
    if (p.aborted) {
      ac.abort(p.reason);
      return { signal: ac.signal, dispose };
    }
    const f = () => {
      ac.abort(p.reason);
      dispose();
    };
    p.addEventListener("abort", f, { once: true });
    hooks.push([p, f]);
  }
  if (ms !== undefined) {
    timer = setTimeout(() => {
      ac.abort(new DOMException(`timed out after ${ms} ms`, "TimeoutError"));
      dispose();
    }, Math.max(0, ms));
  }
  return { signal: ac.signal, dispose };
}
