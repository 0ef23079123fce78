// Lossless JSON for lockd's frames. The server sends fencing tokens (and
// log indexes) as JSON numbers up to 2^64-1, and JSON.parse turns every
// number into a double, which is exact only up to 2^53. Node 20's
// JSON.parse gives a reviver no access to a number's source text, so
// parseJSON rewrites the text first: every integer literal outside a
// string that a double cannot hold exactly becomes a string literal of the
// same digits, which the decoders (wire.ts) turn into a bigint. Everything
// else parses as JSON.parse parses it.

/** Digits long enough to be above 2^53 (9007199254740992 has 16). */
const LONG_RUN = /\d{16}/;

/**
 * parseJSON parses text as JSON.parse does, except that an integer literal
 * above Number.MAX_SAFE_INTEGER (or below its negative) comes back as the
 * string of its digits, so that no digit is lost. It throws SyntaxError on
 * text that is not JSON.
 */
export function parseJSON(text: string): unknown {
  if (!LONG_RUN.test(text)) {
    return JSON.parse(text);
  }
  return JSON.parse(quoteUnsafeIntegers(text));
}

/**
 * quoteUnsafeIntegers returns text with every integer literal outside a
 * string that is not a safe integer put in quotes. It walks the text once,
 * skipping string literals (escapes included); what it does not
 * understand it copies, and JSON.parse reports it.
 */
export function quoteUnsafeIntegers(text: string): string {
  let out = "";
  let from = 0; // start of the text not yet copied to out
  const n = text.length;
  let i = 0;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // A string: skip to its closing quote.
      i++;
      while (i < n) {
        const d = text.charCodeAt(i);
        if (d === 0x5c) {
          i += 2;
          continue;
        }
        i++;
        if (d === 0x22) break;
      }
      continue;
    }
    if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      // A number: [-]digits[.digits][(e|E)[+|-]digits]
      const start = i;
      if (c === 0x2d) i++;
      while (i < n && isDigit(text.charCodeAt(i))) i++;
      let integer = true;
      if (i < n && text.charCodeAt(i) === 0x2e) {
        integer = false;
        i++;
        while (i < n && isDigit(text.charCodeAt(i))) i++;
      }
      if (i < n && (text.charCodeAt(i) === 0x65 || text.charCodeAt(i) === 0x45)) {
        integer = false;
        i++;
        if (i < n && (text.charCodeAt(i) === 0x2b || text.charCodeAt(i) === 0x2d)) i++;
        while (i < n && isDigit(text.charCodeAt(i))) i++;
      }
      const lit = text.slice(start, i);
      if (integer && lit !== "-" && !Number.isSafeInteger(Number(lit))) {
        out += text.slice(from, start) + '"' + lit + '"';
        from = i;
      }
      continue;
    }
    i++;
  }
  return from === 0 ? text : out + text.slice(from);
}

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

/**
 * toBigInt turns a decoded JSON integer — a safe number, or the digits
 * parseJSON kept as a string — into a bigint; undefined for anything else
 * (a fraction, a string that is not an integer or that a number would
 * have held: the wire sent a string, not a number, another type).
 */
export function toBigInt(v: unknown): bigint | undefined {
  if (typeof v === "number") {
    return Number.isSafeInteger(v) ? BigInt(v) : undefined;
  }
  if (typeof v === "string" && /^-?\d+$/.test(v) && !Number.isSafeInteger(Number(v))) {
    return BigInt(v);
  }
  return undefined;
}

/**
 * stringifyObject writes a flat object as JSON, with bigint members as JSON
 * numbers with every digit (JSON.stringify throws on a bigint) and
 * undefined members left out. Nested values go through JSON.stringify.
 */
export function stringifyObject(obj: Record<string, unknown>): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(obj)) {
    if (v === undefined) continue;
    parts.push(JSON.stringify(k) + ":" + (typeof v === "bigint" ? v.toString() : JSON.stringify(v)));
  }
  return "{" + parts.join(",") + "}";
}
