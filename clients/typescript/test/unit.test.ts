// Tests of the parts that need no server: lossless JSON, the frame
// decoders and encoder, errors, redirect trust and options.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Client, InvalidArgumentError, LockHeldError, NoLeaderError, OverloadedError, UntrustedRedirectError, WaitTimeoutError } from "../src/index.js";
import { serverError } from "../src/errors.js";
import { parseJSON, quoteUnsafeIntegers, stringifyObject, toBigInt } from "../src/json.js";
import { Trust, origin } from "../src/redirect.js";
import { DecodeError, decodeFrame, encodeRequest } from "../src/wire.js";

const max64 = (1n << 64n) - 1n;

describe("lossless JSON", () => {
  test("integers above 2^53 keep every digit", () => {
    const text = `{"a":${max64},"b":9007199254740993,"c":-9007199254740993,"d":42,"e":[18446744073709551614,1]}`;
    const v = parseJSON(text) as Record<string, unknown>;
    assert.equal(toBigInt(v.a), max64);
    assert.equal(toBigInt(v.b), 9007199254740993n);
    assert.equal(toBigInt(v.c), -9007199254740993n);
    assert.equal(v.d, 42);
    assert.equal(toBigInt((v.e as unknown[])[0]), max64 - 1n);
    // JSON.parse itself would have lost them.
    assert.notEqual(BigInt((JSON.parse(text) as { b: number }).b), 9007199254740993n);
  });

  test("strings, fractions and exponents are left alone", () => {
    const text = `{"s":"token 18446744073709551615 and \\"quoted 12345678901234567890\\"","f":12345678901234567890.5,"x":1e400,"n":null,"t":true}`;
    assert.equal(quoteUnsafeIntegers(text), text);
    const v = parseJSON(text) as Record<string, unknown>;
    assert.equal(v.s, 'token 18446744073709551615 and "quoted 12345678901234567890"');
    assert.equal(typeof v.f, "number");
    assert.equal(toBigInt(v.f), undefined);
  });

  test("escapes before a closing quote do not end the string early", () => {
    const text = `["a\\\\",12345678901234567890,"\\\\\\"x 99999999999999999999"]`;
    const v = parseJSON(text) as unknown[];
    assert.equal(v[0], "a\\");
    assert.equal(toBigInt(v[1]), 12345678901234567890n);
    assert.equal(v[2], '\\"x 99999999999999999999');
  });

  test("text that is not JSON still fails", () => {
    assert.throws(() => parseJSON(`{"a":12345678901234567890`), SyntaxError);
    assert.throws(() => parseJSON(`{"a":-}`), SyntaxError);
  });

  test("bigints are written with every digit", () => {
    assert.equal(stringifyObject({ id: 1, fencing_token: max64, lock: "x", skip: undefined }), `{"id":1,"fencing_token":18446744073709551615,"lock":"x"}`);
  });
});

describe("frames", () => {
  test("a grant's token up to 2^64-1 decodes exactly", () => {
    const m = decodeFrame(`{"id":7,"type":"granted","lock":"x","fencing_token":18446744073709551615,"mode":"exclusive","expires_at":"2025-01-02T15:04:05.000Z"}`);
    assert.equal(m.fencing_token, max64);
    assert.equal(m.id, 7);
  });

  test("a multi-acquire's grants and a watch change decode", () => {
    const g = decodeFrame(`{"id":3,"type":"granted","mode":"shared","grants":[{"lock":"a","fencing_token":9007199254740995,"expires_at":"","mode":"shared"},{"lock":"b","fencing_token":2,"expires_at":"","mode":"shared"}]}`);
    assert.equal(g.grants?.[0]?.fencing_token, 9007199254740995n);
    const c = decodeFrame(`{"type":"changed","watch_id":1,"lock":"x","index":18446744073709551000,"status":{"lock":"x","held":true,"waiters":0,"mode":"exclusive","limit":1,"index":18446744073709551000,"holders":[{"client_id":"a","fencing_token":18446744073709551615,"mode":"exclusive"}],"holders_total":1}}`);
    assert.equal(c.index, 18446744073709551000n);
    assert.equal(c.status?.holders?.[0]?.fencing_token, max64);
  });

  test("a malformed frame is refused, unknown fields are dropped", () => {
    assert.throws(() => decodeFrame(`{"type":"granted","lock":"x","mode":"exclusive"}`), DecodeError); // no token
    assert.throws(() => decodeFrame(`{"type":"granted","lock":"x","fencing_token":"12","mode":"exclusive"}`), DecodeError); // a string token
    assert.throws(() => decodeFrame(`{"type":"granted","lock":"x","fencing_token":-1,"mode":"exclusive"}`), DecodeError);
    assert.throws(() => decodeFrame(`{"type":"granted","lock":"x","fencing_token":18446744073709551616,"mode":"exclusive"}`), DecodeError); // 2^64
    assert.throws(() => decodeFrame(`{"type":"nonsense"}`), DecodeError);
    assert.throws(() => decodeFrame(`[1]`), DecodeError);
    assert.throws(() => decodeFrame(`not json`), DecodeError);
    // A free lock's first frame without index (0, left out by the server) decodes as index 0.
    const free = decodeFrame(`{"type":"changed","lock":"x","watch_id":1,"status":{"lock":"x","held":false,"waiters":0,"mode":"none","limit":1,"index":0,"holders_total":0}}`);
    assert.equal(free.index, 0n);
    const m = decodeFrame(`{"type":"resync","watch_id":3,"future":{"x":1}}`);
    assert.deepEqual(m, { type: "resync", watch_id: 3 });
  });

  test("requests carry exactly their shape's fields", () => {
    assert.equal(encodeRequest("release", 5, { lock: "x", fencing_token: max64 }), `{"id":5,"op":"release","lock":"x","fencing_token":18446744073709551615}`);
    assert.throws(() => encodeRequest("release", 5, { lock: "x" }), /needs fencing_token/);
    assert.throws(() => encodeRequest("keepalive", 5, { lock: "x" } as never), /has no field lock/);
    assert.throws(() => encodeRequest("acquire", 5, { lock: "x", ttl_ms: 1.5 }), /does not fit/);
  });
});

describe("errors", () => {
  test("each code has its class, with what the reply names", () => {
    const e = serverError("lock_held", "lock x is held by w3", { lock: "x", holder: "w3" });
    assert.ok(e instanceof LockHeldError);
    assert.equal(e.holder, "w3");
    assert.equal(e.lock, "x");
    assert.ok(serverError("wait_timeout", "") instanceof WaitTimeoutError);
    assert.ok(serverError("not_leader", "") instanceof NoLeaderError);
    const o = serverError("overloaded", "busy", { retryAfterMs: 1000 });
    assert.ok(o instanceof OverloadedError);
    assert.equal(o.retryAfterMs, 1000);
    assert.equal(serverError("something_new", "x").code, "something_new");
  });
});

describe("redirect trust", () => {
  test("origins spell out the port", () => {
    assert.equal(origin("http://A.example/x"), "http://a.example:80");
    assert.equal(origin("https://10.0.0.1"), "https://10.0.0.1:443");
    assert.equal(origin("ftp://x"), "");
  });

  test("a leader a configured endpoint names is followed; others are not", () => {
    const t = new Trust(["http://127.0.0.1:7070"]);
    assert.equal(t.leaderHop("http://127.0.0.1:7070/api/v1/ws", "http://127.0.0.1:7170", true), undefined);
    // Once named, it is a member.
    assert.equal(t.leaderHop("http://127.0.0.1:7170/x", "http://127.0.0.1:7170/y", false), undefined);
    // A bare Location to another host, from a configured endpoint: refused for good.
    const bare = t.leaderHop("http://127.0.0.1:7070/x", "http://evil.example/x", false);
    assert.ok(bare instanceof UntrustedRedirectError && bare.fatal);
    // Named only by a member reached through a redirect: refused, not for good.
    const second = t.leaderHop("http://127.0.0.1:7170/x", "http://10.9.9.9:7070", true);
    assert.ok(second instanceof UntrustedRedirectError && !second.fatal);
    // https to http never.
    const t2 = new Trust(["https://127.0.0.1:7070"]);
    const down = t2.leaderHop("https://127.0.0.1:7070/x", "http://127.0.0.1:7070", true);
    assert.ok(down instanceof UntrustedRedirectError && down.fatal);
  });

  test("a Location on another host than the leader it names is refused", () => {
    const t = new Trust(["http://127.0.0.1:7070"]);
    assert.throws(() => t.redirectTarget(new URL("http://127.0.0.1:7070/api/v1/locks/x"), "http://127.0.0.1:7170", "http://evil.example/api/v1/locks/x"), UntrustedRedirectError);
    const ok = t.redirectTarget(new URL("http://127.0.0.1:7070/api/v1/locks/x"), "http://127.0.0.1:7170", "http://127.0.0.1:7170/api/v1/locks/x");
    assert.deepEqual(ok, { next: "http://127.0.0.1:7170/api/v1/locks/x", leader: "http://127.0.0.1:7170" });
  });
});

describe("options", () => {
  test("bad options are refused before anything is sent", async () => {
    await assert.rejects(Client.connect({ endpoints: [] }), InvalidArgumentError);
    await assert.rejects(Client.connect({ endpoints: ["ftp://x"] }), InvalidArgumentError);
    await assert.rejects(Client.connect({ endpoints: ["http://127.0.0.1:1"], sessionTtlMs: 10 }), InvalidArgumentError);
    await assert.rejects(Client.connect({ endpoints: ["http://127.0.0.1:1"], clientId: "a\nb" }), InvalidArgumentError);
    await assert.rejects(Client.connect({ endpoints: ["http://127.0.0.1:1"], token: " x " }), InvalidArgumentError);
  });

  test("connect gives up after dialTimeoutMs with NoLeaderError naming the cause", async () => {
    const t0 = performance.now();
    const e = await Client.connect({ endpoints: ["http://127.0.0.1:1"], dialTimeoutMs: 500 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.ok(e instanceof NoLeaderError, String(e));
    assert.match(e.message, /within 500 ms/);
    assert.match(e.message, /ECONNREFUSED/);
    const took = performance.now() - t0;
    assert.ok(took >= 450 && took < 3000, `took ${took} ms`);
  });
});
