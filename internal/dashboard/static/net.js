// lockd dashboard, network rules: pure functions with no DOM and no state,
// shared by app.js and tested on their own in the browser test
// (TestDashboardScriptRules evaluates them on cases).
'use strict';

(function () {
  function parse(u) {
    try {
      const x = new URL(u);
      return x.protocol === 'http:' || x.protocol === 'https:' ? x : null;
    } catch (e) {
      return null;
    }
  }

  // isLoopback: a host name that never leaves the machine.
  function isLoopback(host) {
    return host === 'localhost' || host.endsWith('.localhost') || host === '[::1]' ||
      /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
  }

  // tokenAllowed says whether a page served from origin page may send the
  // bearer token to the member at origin target. The rule: the token goes
  // to the page's own origin (the operator typed it there), and to another
  // member only over the page's own scheme —
  //   - from an https:// page, to https:// members only: never to an
  //     http:// one, which would carry it in clear text (a downgrade);
  //   - from an http:// page, to http:// members only when both are on
  //     loopback addresses (a cluster on one machine: nothing leaves it).
  // So an http:// page on a real network sends the token only to its own
  // member; open each member's own /ui/ there, or serve the members over
  // https://. A page that may not send the token to a member still reads
  // it when authentication is off (no token is needed then).
  function tokenAllowed(page, target) {
    const p = parse(page);
    const t = parse(target);
    if (!p || !t) return false;
    if (p.origin === t.origin) return true;
    if (p.protocol !== t.protocol) return false;
    return p.protocol === 'https:' || (isLoopback(p.hostname) && isLoopback(t.hostname));
  }

  // sseParser parses a Server-Sent Events stream as the WHATWG HTML
  // standard defines it (what an EventSource does), for a page that reads
  // the stream with fetch so that it can send an Authorization header.
  // push(text) takes the decoded text in chunks cut anywhere and calls
  // onEvent({type, data, id}) for each complete event: lines end in CRLF,
  // LF or CR; a blank line ends an event; "event:", "data:" (one or more,
  // joined with LF) and "id:" fields; ":" comments. "retry:" is skipped:
  // the page decides itself when and where to reconnect.
  function sseParser(onEvent) {
    let buf = '';
    let skipLF = false; // the last chunk ended in CR: a leading LF belongs to it
    let type = '';
    let data = '';
    let hasData = false;
    let id = '';

    function line(l) {
      if (l === '') {
        if (hasData) onEvent({ type: type || 'message', data: data, id: id });
        type = '';
        data = '';
        hasData = false;
        return;
      }
      if (l[0] === ':') return;
      const i = l.indexOf(':');
      const field = i < 0 ? l : l.slice(0, i);
      let value = i < 0 ? '' : l.slice(i + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (field === 'event') {
        type = value;
      } else if (field === 'data') {
        data = hasData ? data + '\n' + value : value;
        hasData = true;
      } else if (field === 'id') {
        if (!value.includes('\0')) id = value;
      }
    }

    return {
      push(text) {
        if (skipLF && text[0] === '\n') text = text.slice(1);
        if (text !== '') skipLF = false;
        buf += text;
        const re = /\r\n|\r|\n/g;
        let start = 0;
        let m;
        while ((m = re.exec(buf)) !== null) {
          line(buf.slice(start, m.index));
          start = re.lastIndex;
          if (m[0] === '\r' && start === buf.length) skipLF = true;
        }
        buf = buf.slice(start);
      },
    };
  }

  globalThis.lockdNet = Object.freeze({ tokenAllowed, isLoopback, sseParser });
})();
