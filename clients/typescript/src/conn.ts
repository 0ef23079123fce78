// One WebSocket connection to the leader: opening it (an upgrade a
// member may refuse or redirect), the frames that come before the client
// installs it, and the requests awaiting their replies.

import { setMaxListeners } from "node:events";
import WebSocket from "ws";
import { deferred, type Deferred } from "./backoff.js";
import type { Client } from "./client.js";
import type { Config } from "./config.js";
import type { Session } from "./session.js";
import type { Watch } from "./watch.js";
import { type DecodeError, type ServerFrame, decodeFrame } from "./wire.js";

/** @internal The lost connection: the caller may retry on the next one. */
export class ConnLostError extends Error {
  override name = "ConnLostError";
}

/** @internal One WebSocket connection to the leader. */
export class Conn {
  readonly calls = new Map<number, Deferred<ServerFrame>>();
  /** Watches on this connection: by the server's watch_id, by the id of a watch request awaiting its answer, and unwatch requests. */
  readonly watchIds = new Map<number, Watch>();
  readonly watchReqs = new Map<number, Watch>();
  readonly unwatches = new Set<number>();
  readonly ac = new AbortController();
  readonly done = deferred<void>();
  readonly first = deferred<ServerFrame>();
  sess: Session | undefined;
  resumed = false;
  installed = false;
  closed = false;
  private early: ServerFrame[] = [];
  private sawFirst = false;

  constructor(
    readonly ws: WebSocket,
    readonly base: string,
    private readonly client: Client,
  ) {
    setMaxListeners(0, this.ac.signal);
    ws.on("message", (data: Buffer, isBinary: boolean) => this.onMessage(data, isBinary));
    ws.on("close", () => client.teardown(this));
    ws.on("error", (e) => client.log("debug", "lockd: connection error", { leader: base, err: e.message }));
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (isBinary) {
      this.client.log("warn", "lockd: a binary frame from the server; ignored", { leader: this.base });
      return;
    }
    const text = data.toString("utf8");
    let m: ServerFrame;
    try {
      m = decodeFrame(text);
    } catch (e) {
      this.client.log("warn", "lockd: a malformed frame from the server", { leader: this.base, err: (e as Error).message });
      if (!this.sawFirst) {
        this.sawFirst = true;
        this.first.reject(e);
        return;
      }
      this.client.onMalformed(this, text, e as DecodeError);
      return;
    }
    if (!this.sawFirst) {
      this.sawFirst = true;
      this.first.resolve(m);
      return;
    }
    if (this.installed) this.client.dispatch(this, m);
    else this.early.push(m);
  }

  /** takeEarly returns the frames that came between the hello and install. */
  takeEarly(): ServerFrame[] {
    const e = this.early;
    this.early = [];
    return e;
  }

  /** send writes one frame; false when the connection cannot take it (it is closing). */
  send(text: string): boolean {
    if (this.closed || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(text, (err) => {
      if (err) this.client.kill(this, `write failed: ${err.message}`);
    });
    return true;
  }
}

/** @internal The outcome of a request: its reply, or why there is none. sentAt is 0 when nothing was sent. */
export interface RoundTrip {
  m?: ServerFrame;
  sentAt: number;
  err?: unknown;
}

/** What opening a WebSocket to a member got instead of an upgrade. */
export class UpgradeRefused extends Error {
  constructor(
    readonly status: number,
    readonly headers: Record<string, string | string[] | undefined>,
    readonly body: string,
  ) {
    super(`WebSocket upgrade refused: HTTP ${status}`);
  }
}

/** The WebSocket URL of a member's base URL. */
export function wsURL(base: string): string {
  return base.replace(/^http/, "ws") + "/api/v1/ws";
}

/** openSocket opens a WebSocket to url; it rejects with UpgradeRefused when the member answers something else. */
export function openSocket(url: string, cfg: Config, signal: AbortSignal): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = {};
    if (cfg.token) headers.Authorization = `Bearer ${cfg.token}`;
    const tls = cfg.tls;
    const ws = new WebSocket(url, {
      headers,
      followRedirects: false,
      handshakeTimeout: cfg.attemptTimeoutMs,
      maxPayload: 4 * 65536,
      perMessageDeflate: false,
      ...(tls ? { ca: tls.ca, cert: tls.cert, key: tls.key, rejectUnauthorized: tls.rejectUnauthorized ?? true } : {}),
    });
    let settled = false;
    const settle = (err: unknown, ok?: WebSocket) => {
      if (settled) return;
      settled = true;
      signal.removeEventListener("abort", onAbort);
      if (ok) resolve(ok);
      else reject(err);
    };
    const onAbort = () => {
      ws.terminate();
      settle(signal.reason ?? new Error("aborted"));
    };
    signal.addEventListener("abort", onAbort, { once: true });
    ws.on("error", (e) => settle(e));
    ws.on("open", () => settle(undefined, ws));
    ws.on("unexpected-response", (req, res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        size += c.length;
        if (size <= 4096) chunks.push(c);
      });
      const done = () => {
        settle(new UpgradeRefused(res.statusCode ?? 0, res.headers, Buffer.concat(chunks).toString("utf8")));
        req.destroy();
        ws.terminate();
      };
      res.on("end", done);
      res.on("error", done);
      res.on("aborted", done);
    });
  });
}
