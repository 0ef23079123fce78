// A scripted stand-in for a lockd member, for what a real cluster cannot be
// made to do on demand: refuse work as overloaded (with a retry hint),
// answer 503 with Retry-After, redirect outside the cluster, or show a
// watch's first picture after a reconnect exactly as a test wants it. It
// speaks the WebSocket protocol's framing (hello, keepalive) and leaves
// every other request to the test's handler.

import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { WebSocket, WebSocketServer } from "ws";

export type Frame = Record<string, any>;

export interface FakeHandlers {
  /** A request frame other than hello and keepalive; reply with conn.send. */
  frame?(conn: FakeConn, f: Frame): void;
  /** A plain HTTP request other than the WebSocket upgrade. */
  http?(req: http.IncomingMessage, res: http.ServerResponse): void;
  /** The upgrade itself: return false after answering res to refuse it. */
  upgrade?(req: http.IncomingMessage, res: http.ServerResponse): boolean;
}

export class FakeConn {
  readonly received: Frame[] = [];
  sessionId = "";
  constructor(readonly ws: WebSocket) {}
  send(f: Frame): void {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(f));
  }
  /** sendRaw sends text as is (for numbers JSON.stringify cannot write). */
  sendRaw(text: string): void {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(text);
  }
  drop(): void {
    this.ws.terminate();
  }
}

export class FakeMember {
  readonly conns: FakeConn[] = [];
  /** Every frame received on any connection, in order, with the time (performance.now()). */
  readonly log: Array<{ t: number; f: Frame }> = [];
  private sessions = 0;
  private constructor(
    private readonly server: http.Server,
    private readonly wss: WebSocketServer,
    readonly handlers: FakeHandlers,
  ) {}

  static async start(handlers: FakeHandlers = {}): Promise<FakeMember> {
    const wss = new WebSocketServer({ noServer: true });
    const server = http.createServer((req, res) => {
      if (req.url === "/api/v1/ws" && req.headers.upgrade === undefined) {
        res.writeHead(426).end();
        return;
      }
      if (handlers.http) handlers.http(req, res);
      else res.writeHead(404, { "Content-Type": "application/json" }).end(JSON.stringify({ error: { code: "not_found", message: "fake" } }));
    });
    const m = new FakeMember(server, wss, handlers);
    server.on("upgrade", (req, socket, head) => {
      if (handlers.upgrade) {
        const res = new http.ServerResponse(req);
        res.assignSocket(socket as never);
        if (!handlers.upgrade(req, res)) {
          res.on("finish", () => socket.destroy());
          return;
        }
        res.detachSocket(socket as never);
      }
      wss.handleUpgrade(req, socket, head, (ws) => m.accept(ws));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    return m;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  private accept(ws: WebSocket): void {
    const conn = new FakeConn(ws);
    this.conns.push(conn);
    ws.on("message", (data) => {
      const f = JSON.parse(data.toString()) as Frame;
      conn.received.push(f);
      this.log.push({ t: performance.now(), f });
      if (f.op === "hello") {
        conn.sessionId = f.session_id ?? `fake-session-${++this.sessions}`;
        conn.send({ id: f.id, type: "hello", session_id: conn.sessionId, session_ttl_ms: f.session_ttl_ms ?? 15000 });
        return;
      }
      if (f.op === "keepalive") {
        conn.send({ id: f.id, type: "ok", session_id: conn.sessionId, session_ttl_ms: 15000 });
        return;
      }
      this.handlers.frame?.(conn, f);
    });
  }

  /** frames lists the frames received with op. */
  frames(op: string): Array<{ t: number; f: Frame }> {
    return this.log.filter((x) => x.f.op === op);
  }

  async close(): Promise<void> {
    for (const c of this.conns) c.drop();
    this.wss.close();
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}
