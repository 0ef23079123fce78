// The client's wire shapes (src/wire.ts) against the server's own
// description of its API, api/openapi/openapi.json: every WebSocket frame
// kind (by `op` or `type`), every field, its type and whether it is
// required, the nested bodies (lock status, holders, grants, errors), the
// HTTP replies the client reads, and the error codes. A field one side has
// and the other lacks fails it, whichever side moved.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { apiErrorCodes } from "../src/errors.js";
import { type FieldKind, type Shape, clientFrameShapes, holderPageShape, lockStatusShape, revokeReplyShape, serverFrameShapes } from "../src/wire.js";
import { repoRoot } from "./harness.js";

type Schema = Record<string, any>;
const doc = JSON.parse(readFileSync(join(repoRoot, "api", "openapi", "openapi.json"), "utf8")) as Schema;
const schemas = doc.components.schemas as Record<string, Schema>;

function deref(s: Schema): Schema {
  let seen = 0;
  while (s && s.$ref) {
    const name = String(s.$ref).replace("#/components/schemas/", "");
    const next = schemas[name];
    assert.ok(next, `dangling $ref ${s.$ref}`);
    s = { ...next, ...Object.fromEntries(Object.entries(s).filter(([k]) => k !== "$ref")) };
    if (++seen > 20) throw new Error("a $ref loop");
  }
  return s;
}

/** The kind of a document schema, in the client's terms. */
function docKind(raw: Schema): string {
  const s = deref(raw);
  if (s.const !== undefined && (s.type === undefined || typeof s.const === "string")) return typeof s.const === "string" ? `const:${s.const}` : kindOfType(typeof s.const);
  const alts = s.anyOf ?? s.oneOf;
  if (alts) {
    const ks = new Set((alts as Schema[]).map((a) => {
      const k = docKind(a);
      return k.startsWith("const:") ? "string" : k;
    }));
    assert.equal(ks.size, 1, `alternatives of different kinds: ${[...ks]}`);
    return [...ks][0]!;
  }
  if (s.enum) return "string";
  switch (s.type) {
    case "string":
      return "string";
    case "boolean":
      return "boolean";
    case "integer":
      return "integer";
    case "object":
      return "object";
    case "array": {
      const it = docKind(s.items);
      return `array<${it}>`;
    }
  }
  throw new Error(`a schema of no kind: ${JSON.stringify(raw).slice(0, 200)}`);
}

function kindOfType(t: string): string {
  return t === "number" ? "integer" : t;
}

/** The kind of a client field, in the same terms. */
function clientKind(k: FieldKind): string {
  if (typeof k === "object") {
    if ("const" in k) return `const:${k.const}`;
    return "object" in k ? "object" : "array<object>";
  }
  return { string: "string", bool: "boolean", int: "integer", u64: "integer", strings: "array<string>", u64s: "array<integer>" }[k];
}

interface Variant {
  props: Record<string, Schema>;
  required: Set<string>;
}

function docVariant(s: Schema): Variant {
  const d = deref(s);
  return { props: d.properties ?? {}, required: new Set(d.required ?? []) };
}

/**
 * compareGroup compares the variants of one frame kind (or one body): the
 * union of their fields, each field's kind, and the fields every variant
 * requires. Nested objects are compared the same way. It returns the
 * differences, each naming where.
 */
function compareGroup(where: string, docVs: Variant[], clientVs: Shape[]): string[] {
  const diffs: string[] = [];
  const docFields = new Map<string, Schema[]>();
  for (const v of docVs) for (const [k, s] of Object.entries(v.props)) docFields.set(k, [...(docFields.get(k) ?? []), s]);
  const clientFields = new Map<string, FieldKind[]>();
  for (const v of clientVs) for (const [k, s] of Object.entries(v)) clientFields.set(k, [...(clientFields.get(k) ?? []), s.kind]);
  for (const k of docFields.keys()) if (!clientFields.has(k)) diffs.push(`${where}.${k}: in the document, not in the client`);
  for (const k of clientFields.keys()) if (!docFields.has(k)) diffs.push(`${where}.${k}: in the client, not in the document`);
  for (const [k, dss] of docFields) {
    const cks = clientFields.get(k);
    if (!cks) continue;
    const dk = new Set(dss.map(docKind));
    const ck = new Set(cks.map(clientKind));
    if ([...dk].sort().join() !== [...ck].sort().join()) {
      diffs.push(`${where}.${k}: the document says ${[...dk].join("|")}, the client ${[...ck].join("|")}`);
      continue;
    }
    // Nested bodies: compare their fields too.
    const nested = cks.map((c) => (typeof c === "object" ? ("object" in c ? c.object : "array" in c ? c.array : undefined) : undefined)).filter((x): x is Shape => x !== undefined);
    if (nested.length > 0) {
      const docNested = dss.map((s) => {
        const d = deref(s);
        return docVariant(d.type === "array" ? d.items : d);
      });
      diffs.push(...compareGroup(`${where}.${k}`, docNested, nested));
    }
  }
  const docReq = [...docFields.keys()].filter((k) => docVs.every((v) => v.required.has(k))).sort();
  const clientReq = [...clientFields.keys()].filter((k) => clientVs.every((v) => v[k]?.required)).sort();
  if (docReq.join() !== clientReq.join()) diffs.push(`${where}: required in the document [${docReq}], in the client [${clientReq}]`);
  return diffs;
}

/** groups sorts variants by the const of their discriminating field. */
function groupDoc(oneOf: Schema[], field: string): Map<string, Variant[]> {
  const g = new Map<string, Variant[]>();
  for (const s of oneOf) {
    const v = docVariant(s);
    const c = deref(v.props[field] ?? {}).const;
    assert.equal(typeof c, "string", `a frame schema without a const ${field}: ${JSON.stringify(s)}`);
    g.set(c, [...(g.get(c) ?? []), v]);
  }
  return g;
}

function groupClient(shapes: Record<string, Shape>, field: string): Map<string, Shape[]> {
  const g = new Map<string, Shape[]>();
  for (const s of Object.values(shapes)) {
    const k = s[field]!.kind as { const: string };
    g.set(k.const, [...(g.get(k.const) ?? []), s]);
  }
  return g;
}

function compareFrames(what: string, oneOfName: string, field: string, shapes: Record<string, Shape>): string[] {
  const root = schemas[oneOfName];
  assert.ok(root?.oneOf, `the document has no ${oneOfName}.oneOf`);
  const d = groupDoc(root.oneOf, field);
  const c = groupClient(shapes, field);
  const diffs: string[] = [];
  for (const k of d.keys()) if (!c.has(k)) diffs.push(`${what} ${field} ${k}: in the document, not in the client`);
  for (const k of c.keys()) if (!d.has(k)) diffs.push(`${what} ${field} ${k}: in the client, not in the document`);
  for (const [k, dvs] of d) {
    const cvs = c.get(k);
    if (cvs) diffs.push(...compareGroup(`${what}[${field}=${k}]`, dvs, cvs));
  }
  return diffs;
}

function replySchema(path: string, method: string): Schema | undefined {
  return doc.paths?.[path]?.[method]?.responses?.["200"]?.content?.["application/json"]?.schema;
}

test("WebSocket request frames match the document", () => {
  const diffs = compareFrames("request", "WSClientFrame", "op", clientFrameShapes);
  assert.deepEqual(diffs, []);
});

test("WebSocket server frames match the document", () => {
  const diffs = compareFrames("server frame", "WSServerFrame", "type", serverFrameShapes);
  assert.deepEqual(diffs, []);
});

test("the HTTP replies the client reads match the document", () => {
  const diffs: string[] = [];
  const status = replySchema("/api/v1/locks/{name}", "get");
  assert.ok(status, "the document has no reply of GET /api/v1/locks/{name}");
  diffs.push(...compareGroup("GET /api/v1/locks/{name}", [docVariant(status)], [lockStatusShape]));
  const revoke = replySchema("/api/v1/locks/{name}", "delete");
  assert.ok(revoke, "the document has no reply of DELETE /api/v1/locks/{name}");
  diffs.push(...compareGroup("DELETE /api/v1/locks/{name}", [docVariant(revoke)], [revokeReplyShape]));
  const holders = replySchema("/api/v1/locks/{name}/holders", "get");
  if (!holders) diffs.push("GET /api/v1/locks/{name}/holders (paging a lock's holders): not in the document");
  else diffs.push(...compareGroup("GET /api/v1/locks/{name}/holders", [docVariant(holders)], [holderPageShape]));
  assert.deepEqual(diffs, []);
});

test("every error code of the document has an error class, and every class's code is in the document", () => {
  const codes: string[] = deref(schemas.ErrorCode!).enum;
  assert.ok(Array.isArray(codes));
  assert.deepEqual(codes.filter((c) => !apiErrorCodes.includes(c)), [], "codes without a class");
  assert.deepEqual(apiErrorCodes.filter((c) => !codes.includes(c)), [], "classes of codes the document lacks");
});

test("the comparison finds a field one side lacks", () => {
  // The check itself: a shape with a field too many, or one too few, differs.
  const status = replySchema("/api/v1/locks/{name}", "get")!;
  const more = { ...lockStatusShape, extra: { kind: "string" } } as Shape;
  assert.deepEqual(compareGroup("x", [docVariant(status)], [more]).filter((d) => d.includes("extra")), ["x.extra: in the client, not in the document"]);
  const { held: _held, ...fewer } = lockStatusShape;
  assert.ok(compareGroup("x", [docVariant(status)], [fewer as Shape]).some((d) => d === "x.held: in the document, not in the client"));
  const wrong = { ...lockStatusShape, waiters: { kind: "string", required: true } } as Shape;
  assert.ok(compareGroup("x", [docVariant(status)], [wrong]).some((d) => d.startsWith("x.waiters: the document says integer")));
});
