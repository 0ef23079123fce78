// Where the client goes, token and all, when a member sends it elsewhere (a
// 307 on HTTP or on the WebSocket upgrade, a not_leader frame on the
// WebSocket): only to a member of the cluster, which is one of the
// configured endpoints or a leader that one of those endpoints named (in
// X-Lockd-Leader or a not_leader frame's leader) — never to a host a bare
// Location names, nor to one that only a member reached through a redirect
// named, and never from https to http. The same rules as the Go client's.

import { UntrustedRedirectError } from "./errors.js";

/** normalizeEndpoint trims trailing slashes so that paths can be appended. */
export function normalizeEndpoint(e: string): string {
  return e.replace(/\/+$/, "");
}

/**
 * origin is u's scheme and host, lower-cased, with the port spelled out
 * ("https://a.example:443"); "" when u is not an absolute http(s) URL.
 */
export function origin(u: string): string {
  let p: URL;
  try {
    p = new URL(u);
  } catch {
    return "";
  }
  const scheme = p.protocol.toLowerCase();
  if ((scheme !== "http:" && scheme !== "https:") || p.hostname === "") return "";
  const port = p.port || (scheme === "http:" ? "80" : "443");
  return `${scheme}//${p.hostname.toLowerCase()}:${port}`;
}

/** Trust decides which members the client may follow a redirect to. */
export class Trust {
  private readonly configured = new Set<string>();
  private readonly named = new Set<string>();

  constructor(endpoints: string[]) {
    for (const e of endpoints) this.configured.add(origin(e));
  }

  /**
   * leaderHop decides whether the client may follow member `from` (a URL it
   * sent a request to) to URL `to`; it returns the refusal, or undefined.
   * `isNamed` says that the member named `to` as the leader
   * (X-Lockd-Leader, or a not_leader frame's leader); a leader a
   * configured endpoint names is trusted from then on.
   */
  leaderHop(from: string, to: string, isNamed: boolean): UntrustedRedirectError | undefined {
    const fo = origin(from);
    const o = origin(to);
    const fromConfigured = this.configured.has(fo);
    const refuse = (why: string, fatal: boolean) =>
      new UntrustedRedirectError(`lockd: untrusted redirect: not following ${from} to ${to}: ${why}`, fatal);
    if (o === "") return refuse("not an http(s) URL", fromConfigured);
    if (fo.startsWith("https:") && o.startsWith("http:")) {
      return refuse("it leaves https for http, which would send the token and the request in the clear (advertise the members' https:// URLs)", true);
    }
    if (this.configured.has(o) || this.named.has(o)) return undefined;
    if (isNamed && fromConfigured) {
      this.named.add(o);
      return undefined;
    }
    if (!isNamed) {
      return refuse("the redirect names no leader (no X-Lockd-Leader header), and its Location is neither a configured endpoint nor a leader one of them named", fromConfigured);
    }
    return refuse("neither a configured endpoint nor a leader one of them named (a member reached through a redirect named it)", false);
  }

  /**
   * redirectTarget reads a redirect that the member at reqURL answered:
   * `next` is the URL to send the request to, `leader` the leader's base
   * URL to remember. A Location on another host than the X-Lockd-Leader it
   * comes with is refused: lockd sends the same path on the leader it
   * names. It throws UntrustedRedirectError or Error.
   */
  redirectTarget(reqURL: URL, leaderHeader: string | undefined, location: string | undefined): { next: string; leader: string } {
    const from = reqURL.toString();
    let loc: URL | undefined;
    if (location) {
      try {
        loc = new URL(location, reqURL);
      } catch {
        throw new Error(`lockd: bad Location ${JSON.stringify(location)}`);
      }
    }
    let next: string;
    let leader = leaderHeader ?? "";
    if (leader === "" && loc === undefined) {
      throw new Error("lockd: a redirect without Location or X-Lockd-Leader");
    } else if (leader === "") {
      next = loc!.toString();
      leader = `${loc!.protocol}//${loc!.host}`;
    } else if (loc === undefined) {
      next = normalizeEndpoint(leader) + reqURL.pathname + reqURL.search;
    } else if (origin(loc.toString()) !== origin(leader)) {
      throw new UntrustedRedirectError(
        `lockd: untrusted redirect: not following ${from} to ${loc.toString()}: the Location is not on the leader it names (${leader})`,
        this.configured.has(origin(from)),
      );
    } else {
      next = loc.toString();
    }
    const err = this.leaderHop(from, next, leaderHeader !== undefined && leaderHeader !== "");
    if (err) throw err;
    return { next, leader: normalizeEndpoint(leader) };
  }
}
