// The wire: lockd's WebSocket frames and the JSON bodies the client reads,
// described once as data (the shapes below). The decoders check every frame
// against its shape, and the encoder builds every request from its shape, so
// the client reads and writes exactly the fields the shapes name. The
// package's tests hold the shapes against api/openapi/openapi.json, the
// server's own description of its frames: a field one has and the other
// lacks, or of another type, fails them.

import { parseJSON, stringifyObject, toBigInt } from "./json.js";

/** What a field holds on the wire. */
export type FieldKind =
  | "string"
  | "bool"
  /** An integer the client keeps as a number (TTLs, counts, ids). */
  | "int"
  /** An integer up to 2^64-1, kept as a bigint (fencing tokens, log indexes). */
  | "u64"
  /** An array of strings. */
  | "strings"
  /** An array of unsigned 64-bit integers, kept as bigints. */
  | "u64s"
  | { const: string }
  | { object: Shape }
  | { array: Shape };

export interface FieldSpec {
  kind: FieldKind;
  /** The frame is malformed without it. */
  required?: boolean;
  /**
   * A required integer that the server leaves out when it is 0 (its
   * encoder omits empty fields): absent decodes as 0.
   */
  absentIsZero?: boolean;
}

export type Shape = Record<string, FieldSpec>;

// Literal types, so that RequestFields can tell a field's type from its spec.
const str = { kind: "string" } as const;
const reqStr = { kind: "string", required: true } as const;
const int = { kind: "int" } as const;
const reqInt = { kind: "int", required: true } as const;
const u64 = { kind: "u64" } as const;
const reqU64 = { kind: "u64", required: true } as const;
const bool = { kind: "bool" } as const;
const reqBool = { kind: "bool", required: true } as const;

// --- bodies shared by frames and HTTP replies ---

/** An error body: {"code", "message"}. */
export interface WireError {
  code: string;
  message: string;
}
const errorShape = {
  code: reqStr,
  message: reqStr,
} satisfies ShapeOf<WireError>;

/** One grant of a multi-acquire. */
export interface WireGrant {
  lock: string;
  fencing_token: bigint;
  expires_at: string;
  mode: string;
  fencing_proof?: string;
}
const grantShape = {
  lock: reqStr,
  fencing_token: reqU64,
  expires_at: reqStr,
  mode: reqStr,
  fencing_proof: str,
} satisfies ShapeOf<WireGrant>;

/** One holder in a lock status. */
export interface WireHolder {
  client_id: string;
  fencing_token: bigint;
  expires_at?: string;
  mode: string;
  value?: string;
}
const holderShape = {
  client_id: reqStr,
  fencing_token: reqU64,
  expires_at: str,
  mode: reqStr,
  value: str,
} satisfies ShapeOf<WireHolder>;

/** A lock's status (GET /api/v1/locks/{name}, list items, watch frames). */
export interface WireLockStatus {
  lock: string;
  held: boolean;
  client_id?: string;
  fencing_token?: bigint;
  expires_at?: string;
  waiters: number;
  mode: string;
  limit: number;
  holders?: WireHolder[];
  holders_total: number;
  value?: string;
  delayed_until?: string;
  index: bigint;
  stale?: boolean;
}
export const lockStatusShape = {
  lock: reqStr,
  held: reqBool,
  client_id: str,
  fencing_token: u64,
  expires_at: str,
  waiters: reqInt,
  mode: reqStr,
  limit: reqInt,
  holders: { kind: { array: holderShape } },
  holders_total: reqInt,
  value: str,
  delayed_until: str,
  index: reqU64,
  stale: bool,
} satisfies ShapeOf<WireLockStatus>;

/** A page of the holders endpoint (GET /api/v1/locks/{name}/holders). */
export interface WireHolderPage {
  lock: string;
  holders: WireHolder[];
  holders_total: number;
  next: string;
  stale?: boolean;
}
export const holderPageShape = {
  lock: reqStr,
  holders: { kind: { array: holderShape }, required: true },
  holders_total: reqInt,
  next: reqStr,
  stale: bool,
} satisfies ShapeOf<WireHolderPage>;

/** The reply of a revocation (DELETE /api/v1/locks/{name}). */
export interface WireRevokeReply {
  revoked: bigint[];
}
export const revokeReplyShape = {
  revoked: { kind: "u64s", required: true },
} satisfies ShapeOf<WireRevokeReply>;

// --- server frames ---

/**
 * A server frame: a reply (with the request's id) or a push. One type for
 * all of them, with the fields of every kind, as decoded by decodeFrame;
 * which ones a frame has is its shape's business.
 */
export interface ServerFrame {
  id?: number;
  type: string;
  session_id?: string;
  session_ttl_ms?: number;
  lock?: string;
  fencing_token?: bigint;
  expires_at?: string;
  fencing_proof?: string;
  mode?: string;
  grants?: WireGrant[];
  reason?: string;
  error?: WireError;
  holder?: string;
  leader?: string;
  retry_after_ms?: number;
  watch_id?: number;
  index?: bigint;
  status?: WireLockStatus;
  cancelled?: boolean;
  read_only?: boolean;
}

const id = int;

/** The shape of every server frame, by kind. `type` tells them apart; `granted` comes with `lock` or with `grants`. */
export const serverFrameShapes = {
  hello: {
    id,
    type: { kind: { const: "hello" }, required: true },
    // A session's id and TTL; or, for a token with read access only,
    // read_only and no session.
    session_id: str,
    session_ttl_ms: int,
    read_only: bool,
  },
  granted: {
    id,
    type: { kind: { const: "granted" }, required: true },
    lock: reqStr,
    fencing_token: reqU64,
    expires_at: str,
    fencing_proof: str,
    mode: reqStr,
  },
  grantedMany: {
    id,
    type: { kind: { const: "granted" }, required: true },
    grants: { kind: { array: grantShape }, required: true },
    mode: reqStr,
  },
  ok: {
    id,
    type: { kind: { const: "ok" }, required: true },
    lock: str,
    fencing_token: u64,
    expires_at: str,
    session_id: str,
    session_ttl_ms: int,
    watch_id: int,
    fencing_proof: str,
    cancelled: bool,
  },
  error: {
    id,
    type: { kind: { const: "error" }, required: true },
    error: { kind: { object: errorShape }, required: true },
    lock: str,
    holder: str,
    leader: str,
    retry_after_ms: int,
    // A push that ends that watch (a token reload took its access away).
    watch_id: int,
  },
  lost: {
    type: { kind: { const: "lost" }, required: true },
    lock: reqStr,
    fencing_token: reqU64,
    reason: reqStr,
  },
  changed: {
    type: { kind: { const: "changed" }, required: true },
    watch_id: reqInt,
    lock: reqStr,
    // The initial frame of a lock that never had state, in a cluster that
    // dropped no lock yet, has index 0, and the server leaves it out.
    index: { kind: "u64", required: true, absentIsZero: true },
    status: { kind: { object: lockStatusShape }, required: true },
  },
  resync: {
    type: { kind: { const: "resync" }, required: true },
    watch_id: reqInt,
  },
  synced: {
    type: { kind: { const: "synced" }, required: true },
    watch_id: reqInt,
    index: reqU64,
  },
} satisfies Record<string, PartialShapeOf<ServerFrame>>;

// Every field of ServerFrame is in some shape (a compile-time check).
type ServerShapeKeys = { [K in keyof typeof serverFrameShapes]: keyof (typeof serverFrameShapes)[K] }[keyof typeof serverFrameShapes];
const _everyServerField: Exclude<keyof ServerFrame, ServerShapeKeys> extends never ? true : never = true;
void _everyServerField;

// --- client frames ---

const handoffShape = {
  id: reqInt,
  op: { kind: { const: "acquire" } },
  lock: str,
  ttl_ms: int,
  wait_timeout_ms: int,
  mode: str,
  limit: int,
  lock_delay_ms: int,
  value: str,
} satisfies Shape;

/** The shape of every request frame, by kind; `op` tells them apart (an acquire names `lock` or `locks`). */
export const clientFrameShapes = {
  hello: {
    id: reqInt,
    op: { kind: { const: "hello" }, required: true },
    client_id: reqStr,
    session_ttl_ms: int,
    session_id: str,
  },
  acquire: {
    id: reqInt,
    op: { kind: { const: "acquire" }, required: true },
    lock: reqStr,
    ttl_ms: int,
    wait_timeout_ms: int,
    mode: str,
    limit: int,
    lock_delay_ms: int,
    value: str,
  },
  acquireMany: {
    id: reqInt,
    op: { kind: { const: "acquire" }, required: true },
    locks: { kind: "strings", required: true } as const,
    ttl_ms: int,
    wait_timeout_ms: int,
    mode: str,
    limit: int,
    lock_delay_ms: int,
    value: str,
  },
  release: {
    id: reqInt,
    op: { kind: { const: "release" }, required: true },
    lock: reqStr,
    fencing_token: reqU64,
    // A release that hands the lock on to another acquire of this client
    // in the same step. This client does not send it (its acquires of a
    // lock it holds wait for the release and then queue as any acquire).
    handoff: { kind: { object: handoffShape } },
  },
  renew: {
    id: reqInt,
    op: { kind: { const: "renew" }, required: true },
    lock: reqStr,
    fencing_token: reqU64,
    ttl_ms: int,
  },
  keepalive: {
    id: reqInt,
    op: { kind: { const: "keepalive" }, required: true },
  },
  value: {
    id: reqInt,
    op: { kind: { const: "value" }, required: true },
    lock: reqStr,
    fencing_token: reqU64,
    value: reqStr,
  },
  watch: {
    id: reqInt,
    op: { kind: { const: "watch" }, required: true },
    lock: str,
    prefix: str,
  },
  unwatch: {
    id: reqInt,
    op: { kind: { const: "unwatch" }, required: true },
    watch_id: reqInt,
  },
  cancel: {
    id: reqInt,
    op: { kind: { const: "cancel" }, required: true },
    lock: reqStr,
  },
  cancelMany: {
    id: reqInt,
    op: { kind: { const: "cancel" }, required: true },
    locks: { kind: "strings", required: true } as const,
  },
} satisfies Record<string, Shape>;

export type RequestKind = keyof typeof clientFrameShapes;

/** The members of a request of kind K, less id and op (the client fills those in). */
export type RequestFields<K extends RequestKind> = {
  [F in Exclude<keyof (typeof clientFrameShapes)[K], "id" | "op">]?: FieldValue<(typeof clientFrameShapes)[K][F]>;
};

type FieldValue<S> = S extends { kind: "u64" }
  ? bigint
  : S extends { kind: "int" }
    ? number
    : S extends { kind: "bool" }
      ? boolean
      : S extends { kind: "strings" }
        ? string[]
        : string;

/**
 * encodeRequest builds the JSON text of a request of kind `kind` with id and
 * fields. It throws on a field its shape does not have, a required one
 * missing, or a value of the wrong type: the client never sends a frame
 * the server would refuse as malformed.
 */
export function encodeRequest<K extends RequestKind>(kind: K, reqId: number, fields: RequestFields<K>): string {
  const shape: Shape = clientFrameShapes[kind];
  const op = (shape.op!.kind as { const: string }).const;
  const obj: Record<string, unknown> = { id: reqId, op };
  for (const [k, v] of Object.entries(fields)) {
    if (v === undefined) continue;
    const spec = shape[k];
    if (spec === undefined || k === "id" || k === "op") {
      throw new TypeError(`lockd: a ${kind} request has no field ${k}`);
    }
    if (!valueFits(spec.kind, v)) {
      throw new TypeError(`lockd: ${kind} request field ${k}: ${typeof v} does not fit`);
    }
    obj[k] = v;
  }
  for (const [k, spec] of Object.entries(shape)) {
    if (spec.required && obj[k] === undefined) {
      throw new TypeError(`lockd: a ${kind} request needs ${k}`);
    }
  }
  return stringifyObject(obj);
}

function valueFits(kind: FieldKind, v: unknown): boolean {
  switch (kind) {
    case "string":
      return typeof v === "string";
    case "bool":
      return typeof v === "boolean";
    case "int":
      return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
    case "u64":
      return typeof v === "bigint" && v >= 0n && v < 1n << 64n;
    case "strings":
      return Array.isArray(v) && v.every((x) => typeof x === "string");
    case "u64s":
      return Array.isArray(v) && v.every((x) => typeof x === "bigint");
  }
  return false;
}

/** A frame or body that does not fit its shape. */
export class DecodeError extends Error {
  override name = "DecodeError";
}

/**
 * decodeFrame parses and checks one server frame. It throws DecodeError on
 * text that is not JSON, a frame of an unknown type, or a field of the
 * wrong type or missing; fields the shape does not name are dropped (a
 * newer server may send more).
 */
export function decodeFrame(text: string): ServerFrame {
  let v: unknown;
  try {
    v = parseJSON(text);
  } catch (e) {
    throw new DecodeError(`lockd: a frame that is not JSON: ${(e as Error).message}`);
  }
  if (!isObject(v) || typeof v.type !== "string") {
    throw new DecodeError("lockd: a frame without a type");
  }
  let shape: Shape | undefined;
  switch (v.type) {
    case "granted":
      shape = v.grants !== undefined ? serverFrameShapes.grantedMany : serverFrameShapes.granted;
      break;
    default:
      shape = (serverFrameShapes as Record<string, Shape>)[v.type];
  }
  if (shape === undefined) {
    throw new DecodeError(`lockd: a frame of unknown type ${JSON.stringify(v.type)}`);
  }
  return decodeShape(v, shape, "frame") as unknown as ServerFrame;
}

/** decodeBody parses and checks an HTTP reply body of shape `shape`. */
export function decodeBody<T>(text: string, shape: Shape, what: string): T {
  let v: unknown;
  try {
    v = parseJSON(text);
  } catch (e) {
    throw new DecodeError(`lockd: ${what}: not JSON: ${(e as Error).message}`);
  }
  return decodeShape(v, shape, what) as T;
}

/** decodeValue checks an already parsed value (parseJSON's) against shape. */
export function decodeValue<T>(v: unknown, shape: Shape, what: string): T {
  return decodeShape(v, shape, what) as T;
}

function decodeShape(v: unknown, shape: Shape, path: string): Record<string, unknown> {
  if (!isObject(v)) {
    throw new DecodeError(`lockd: ${path}: not an object`);
  }
  const out: Record<string, unknown> = {};
  for (const [k, spec] of Object.entries(shape)) {
    const x = v[k];
    if (x === undefined || x === null) {
      if (spec.absentIsZero) {
        out[k] = spec.kind === "u64" ? 0n : 0;
        continue;
      }
      if (spec.required) throw new DecodeError(`lockd: ${path}: ${k} is missing`);
      continue;
    }
    out[k] = decodeField(x, spec.kind, `${path}.${k}`);
  }
  return out;
}

function decodeField(x: unknown, kind: FieldKind, path: string): unknown {
  const bad = (): never => {
    throw new DecodeError(`lockd: ${path}: ${JSON.stringify(x)?.slice(0, 64)} is not ${describeKind(kind)}`);
  };
  if (typeof kind === "object") {
    if ("const" in kind) return x === kind.const ? x : bad();
    if ("object" in kind) return decodeShape(x, kind.object, path);
    if (!Array.isArray(x)) return bad();
    return x.map((e, i) => decodeShape(e, kind.array, `${path}[${i}]`));
  }
  switch (kind) {
    case "string":
      return typeof x === "string" ? x : bad();
    case "bool":
      return typeof x === "boolean" ? x : bad();
    case "int":
      return typeof x === "number" && Number.isSafeInteger(x) ? x : bad();
    case "u64": {
      const b = toBigInt(x);
      return b !== undefined && b >= 0n && b < 1n << 64n ? b : bad();
    }
    case "strings":
      return Array.isArray(x) && x.every((e) => typeof e === "string") ? x : bad();
    case "u64s":
      return Array.isArray(x) ? x.map((e, i) => decodeField(e, "u64", `${path}[${i}]`)) : bad();
  }
}

function describeKind(kind: FieldKind): string {
  if (typeof kind === "object") {
    if ("const" in kind) return JSON.stringify(kind.const);
    return "object" in kind ? "an object" : "an array of objects";
  }
  return { string: "a string", bool: "a boolean", int: "an integer", u64: "an unsigned 64-bit integer", strings: "an array of strings", u64s: "an array of unsigned 64-bit integers" }[kind];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** A shape naming exactly the members of T. */
type ShapeOf<T> = { [K in keyof Required<T>]: FieldSpec };
/** A shape naming some members of T and nothing else. */
type PartialShapeOf<T> = { [K in keyof T]?: FieldSpec };
