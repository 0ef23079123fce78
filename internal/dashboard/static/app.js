// lockd dashboard: reads /ui/events (Server-Sent Events) from one member and
// renders each snapshot. When the stream breaks (the member died or went
// silent), it reconnects with backoff to the members it has learned, the
// known leader first, and moves on to the new leader once one is elected, so
// a page opened on a leader follows the leader.
// The stream is read with fetch, not EventSource, so that the token travels
// in the Authorization header and never in a URL (see net.js for the
// framing and for which members may receive the token).
// Every value from the server is written with textContent, never as HTML.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const { tokenAllowed, sseParser } = globalThis.lockdNet;

  const HOME = location.origin;
  const OPEN_TIMEOUT_MS = 5000; // a stream that sends nothing in this time is abandoned
  const MAX_BACKOFF_MS = 5000;

  const st = {
    snap: null,
    offset: 0,          // serving member's clock minus the browser's clock, ms
    base: HOME,         // origin of the member whose stream is read
    stream: null,       // AbortController of the stream being read
    attempt: 0,
    lastEvent: 0,
    live: false,
    gen: 0,             // connection attempt counter
    openTimer: 0,
    retryTimer: 0,
    following: false,   // the page left its first member: prefer the leader
    upgraded: new Set(), // leader+term already tried while following
    members: new Map(), // origin -> member id, learned from snapshots
    unreachable: new Map(), // origin this browser failed to read from -> term then
    ttlCells: [],       // [text, bar, expiresAt, ttlMs] for the holders' countdowns
    delayCells: [],     // [tag, delayedUntil] for the lock-delays' countdowns
  };

  // ---- helpers --------------------------------------------------------

  function originOf(u) {
    try {
      const x = new URL(u);
      return x.protocol === 'http:' || x.protocol === 'https:' ? x.origin : '';
    } catch (e) {
      return '';
    }
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function label(origin) {
    const id = st.members.get(origin);
    return id ? id + ' (' + origin.replace(/^https?:\/\//, '') + ')' : origin.replace(/^https?:\/\//, '');
  }

  function fmtLeft(ms) {
    if (ms <= 0) return 'expiring';
    const s = ms / 1000;
    if (s < 60) return s.toFixed(1) + ' s';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
    const h = Math.floor(m / 60);
    return h + 'h ' + String(m % 60).padStart(2, '0') + 'm';
  }

  function setConn(state, text) {
    $('conn').dataset.state = state;
    $('conn-text').textContent = text;
  }

  // ---- connection -----------------------------------------------------

  // candidates orders where to try next: the leader the last snapshot
  // named, then the other members, then the member that just failed.
  function candidates(failed) {
    const out = [];
    const add = (o) => {
      if (o && !out.includes(o)) out.push(o);
    };
    const s = st.snap;
    if (s && s.cluster) {
      const lead = originOf(s.cluster.leader_http);
      if (lead !== failed) add(lead);
      for (const m of s.cluster.members || []) {
        const o = originOf(m.http_addr);
        if (o !== failed && !st.unreachable.has(o)) add(o);
      }
      for (const m of s.cluster.members || []) {
        const o = originOf(m.http_addr);
        if (o !== failed) add(o);
      }
    }
    if (HOME !== failed) add(HOME);
    add(failed);
    return out;
  }

  function clearTimers() {
    clearTimeout(st.openTimer);
    clearTimeout(st.retryTimer);
  }

  // connect first asks the member for one snapshot (a 401 or 403 when
  // authentication is on shows there, before any stream), then opens its
  // event stream.
  function connect(base) {
    clearTimers();
    if (st.stream) st.stream.abort();
    st.stream = null;
    st.base = base;
    st.live = false;
    const gen = ++st.gen; // results of an earlier attempt are ignored
    setConn('connecting', 'Connecting to ' + label(base) + '…');
    const ac = new AbortController();
    st.openTimer = setTimeout(() => ac.abort(), OPEN_TIMEOUT_MS);
    fetch(base + '/ui/snapshot', { headers: authHeaders(base), cache: 'no-store', signal: ac.signal })
      .then((resp) => {
        if (gen !== st.gen) return undefined;
        clearTimeout(st.openTimer);
        if (resp.status === 401 || resp.status === 403) return refused(base, gen, resp);
        if (!resp.ok) throw new Error('HTTP ' + resp.status);
        showTokenForm(false);
        openStream(base, gen);
        return undefined;
      })
      .catch(() => {
        if (gen === st.gen) fail(base, null);
      });
  }

  // openStream reads the member's event stream until it ends, fails, goes
  // silent (see the watchdog below) or another connection replaces it.
  function openStream(base, gen) {
    const ac = new AbortController();
    st.stream = ac;
    const current = () => ac === st.stream && gen === st.gen;
    let got = false;
    st.openTimer = setTimeout(() => {
      if (!got && current()) fail(base, ac);
    }, OPEN_TIMEOUT_MS);

    const parser = sseParser((ev) => {
      if (!current()) return;
      if (ev.type === 'ping') {
        st.lastEvent = Date.now();
        try {
          st.offset = JSON.parse(ev.data).now - Date.now();
        } catch (e) { /* keep the old offset */ }
        return;
      }
      if (ev.type !== 'message') return;
      let snap;
      try {
        snap = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      st.lastEvent = Date.now();
      if (!got) {
        got = true;
        clearTimeout(st.openTimer);
        st.attempt = 0;
        st.unreachable.delete(base);
        st.live = true;
      }
      onSnapshot(snap);
    });

    fetch(base + '/ui/events', { headers: authHeaders(base), cache: 'no-store', signal: ac.signal })
      .then(async (resp) => {
        if (!current()) return;
        if (resp.status === 401 || resp.status === 403) { // the token was removed meanwhile
          clearTimeout(st.openTimer);
          await refused(base, gen, resp);
          return;
        }
        if (!resp.ok || !resp.body) throw new Error('HTTP ' + resp.status);
        const reader = resp.body.getReader();
        const decoder = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) throw new Error('the stream ended');
          if (!current()) return;
          parser.push(decoder.decode(value, { stream: true }));
        }
      })
      // Any end of a current stream is a failure: reconnect with backoff,
      // to the next member (fail). Aborted streams are no longer current.
      .catch(() => {
        if (current()) fail(base, ac);
      });
  }

  // ---- authentication -------------------------------------------------

  // With authentication on, the page needs a token with read access to
  // every lock. It is kept for this tab only (sessionStorage), sent in the
  // Authorization header only (never in a URL: those end up in logs and
  // history), and only to the members tokenAllowed admits (net.js): this
  // page's own origin, https:// members from an https:// page, loopback
  // members from a loopback http:// page.
  const TOKEN_KEY = 'lockd.dashboard.token';

  function token() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (e) {
      return '';
    }
  }

  // authHeaders: the request headers for base. Without a token, none: the
  // request stays a simple one, with no CORS preflight.
  function authHeaders(base) {
    const t = token();
    return t && tokenAllowed(HOME, base) ? { Authorization: 'Bearer ' + t } : {};
  }

  // refused handles a 401 or 403: ask for a token, unless this member is
  // one the token may not be sent to; then asking is pointless, and the
  // page moves on to another member.
  function refused(base, gen, resp) {
    return resp.json().catch(() => ({})).then((body) => {
      if (gen !== st.gen) return;
      if (!tokenAllowed(HOME, base)) {
        fail(base, null, label(base) + ' needs a token, which this page sends only to ' +
          (location.protocol === 'https:' ? 'https:// members' : 'its own member'));
        return;
      }
      askToken(base, resp.status, body);
    });
  }

  function showTokenForm(show) {
    $('auth').hidden = !show;
  }

  function askToken(base, status, body) {
    const msg = body && body.error && body.error.message;
    setConn('lost', status === 401 ? 'Token required' : 'Access denied');
    $('auth-text').textContent = (status === 401 && !token())
      ? label(base) + ' requires a bearer token with read access to every lock.'
      : (msg || 'The token was refused.');
    showTokenForm(true);
    $('auth-token').focus();
  }

  $('auth').addEventListener('submit', (ev) => {
    ev.preventDefault();
    try {
      sessionStorage.setItem(TOKEN_KEY, $('auth-token').value.trim());
    } catch (e) { /* storage disabled: nothing to keep it in */ }
    $('auth-token').value = '';
    st.attempt = 0;
    connect(st.base);
  });

  // fail gives up on base (its stream when stream is set) and tries the
  // next member after a backoff; why, if set, says why base was left.
  function fail(base, stream, why) {
    if (stream) stream.abort();
    if (stream && stream !== st.stream) return;
    st.stream = null;
    st.live = false;
    st.following = true;
    // (A member left for a reason, one the token may not go to, answered.)
    if (!why) st.unreachable.set(base, st.snap && st.snap.cluster ? st.snap.cluster.term : 0);
    const order = candidates(base);
    const next = order[st.attempt % order.length];
    const delay = Math.min(MAX_BACKOFF_MS, 200 * Math.pow(1.6, st.attempt)) * (0.8 + 0.4 * Math.random());
    st.attempt++;
    console.info('lockd dashboard: lost the stream from ' + base + '; next try ' + next + ' in ' + Math.round(delay) + ' ms');
    setConn('lost', (why || 'Lost ' + label(base)) + ' · trying ' + label(next) + '…');
    if (st.snap) render(st.snap); // mark the member unreachable
    clearTimers();
    st.retryTimer = setTimeout(() => connect(next), delay);
  }

  // A stream that goes silent for longer than a few heartbeats is dead even
  // if the TCP connection looks open (a partition, a suspended laptop).
  setInterval(() => {
    if (!st.stream || !st.live || !st.snap) return;
    const limit = (st.snap.heartbeat_ms || 10000) * 2.5 + 2000;
    if (Date.now() - st.lastEvent > limit) fail(st.base, st.stream);
  }, 1000);

  // A member marked unreachable is probed (GET /healthz, an opaque
  // no-cors request: only whether it answers matters) and unmarked once it
  // answers again, e.g. after a restart.
  setInterval(() => {
    for (const o of st.unreachable.keys()) {
      if (o === st.base && !st.live) continue; // being retried already
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), 2000);
      fetch(o + '/healthz', { mode: 'no-cors', cache: 'no-store', signal: ac.signal })
        .then(() => {
          st.unreachable.delete(o);
          if (st.snap) render(st.snap);
        })
        .catch(() => { /* still down */ })
        .finally(() => clearTimeout(timer));
    }
  }, 3000);

  // ---- rendering ------------------------------------------------------

  function onSnapshot(s) {
    st.snap = s;
    st.offset = s.now - Date.now();
    for (const m of (s.cluster && s.cluster.members) || []) {
      const o = originOf(m.http_addr);
      if (o) st.members.set(o, m.id);
    }
    const self = s.member || {};
    setConn('live', 'Live · ' + (self.id || label(st.base)));
    render(s);

    // After a failover the page may have landed on a follower (the new
    // leader was not elected yet): move on to the leader once it is known,
    // once per leader and term. A page the operator opened on a follower
    // on purpose stays there.
    const lead = originOf(s.cluster && s.cluster.leader_http);
    const key = lead + '#' + (s.cluster && s.cluster.term);
    const deadSince = st.unreachable.get(lead);
    const dead = deadSince !== undefined && (s.cluster.term || 0) <= deadSince;
    if (st.following && s.stale && lead && lead !== st.base && !dead && !st.upgraded.has(key)) {
      st.upgraded.add(key);
      console.info('lockd dashboard: following the leader ' + (s.cluster.leader_id || '') + ' at ' + lead);
      connect(lead);
    }
  }

  function render(s) {
    const c = s.cluster || {};
    const self = s.member || {};
    const members = c.members || [];

    // summary cards
    $('leader').textContent = c.leader_id || 'none';
    $('leader').classList.toggle('warn', !c.leader_id);
    $('leader-url').textContent = c.leader_id ? (c.leader_http || 'HTTP address not published yet') : 'election in progress';
    $('term').textContent = c.term !== undefined ? c.term : '—';
    const voters = members.filter((m) => m.voter).length;
    $('members-count').textContent = members.length + (members.length === 1 ? ' member' : ' members') +
      (voters !== members.length ? ', ' + voters + ' voting' : '');
    $('held').textContent = s.held;
    $('locks-total').textContent = s.locks_total + (s.locks_total === 1 ? ' lock' : ' locks') + ' in the table';
    $('waiters').textContent = s.waiters;
    $('sessions').textContent = s.sessions + (s.sessions === 1 ? ' open session' : ' open sessions');
    $('last-token').textContent = s.last_token;
    document.body.dataset.leader = c.leader_id || '';

    // notice
    const notice = $('notice');
    const msgs = [];
    if (s.cluster_error) msgs.push('Cluster configuration unavailable on ' + (self.id || 'this member') + ': ' + s.cluster_error);
    if (s.stale) {
      msgs.push('Served by ' + (self.state || 'follower').toLowerCase() + ' ' + (self.id || '') +
        ' from its local replica: it may lag the leader by a moment.');
    }
    notice.hidden = msgs.length === 0;
    notice.textContent = msgs.join(' ');

    $('self-id').textContent = self.id || '—';
    $('self-state').textContent = self.state || '—';
    $('self-state').dataset.role = (self.state || '').toLowerCase();

    // members
    const mb = $('members-body');
    mb.replaceChildren();
    for (const m of members) {
      const o = originOf(m.http_addr);
      const tr = el('tr');
      tr.dataset.member = m.id;
      const id = el('td', 'id');
      id.append(el('span', 'mono', m.id));
      if (m.id === self.id) id.append(el('span', 'tag', 'serving'));
      if (o && st.unreachable.has(o)) id.append(el('span', 'tag bad', 'unreachable'));
      let role = m.id === c.leader_id ? 'Leader' : (m.voter ? 'Follower' : 'Non-voter');
      if (m.id === self.id && self.state && self.state !== 'Leader' && self.state !== 'Follower') role = self.state;
      const rc = el('td', 'role');
      const badge = el('span', 'badge', role);
      badge.dataset.role = role.toLowerCase();
      rc.append(badge);
      const url = el('td', 'url');
      if (o) {
        const a = el('a', 'mono', m.http_addr);
        a.href = o + '/ui/';
        url.append(a);
      } else {
        url.append(el('span', 'muted', 'not published yet'));
      }
      tr.append(id, rc, el('td', 'voter', m.voter ? 'yes' : 'no'), url, el('td', 'mono muted', m.raft_addr));
      mb.append(tr);
    }

    // locks: one row per lock; one line per holder in the holder, token,
    // time-left and value cells, so that a holder's facts line up.
    const locks = s.locks || [];
    const lb = $('locks-body');
    lb.replaceChildren();
    st.ttlCells = [];
    st.delayCells = [];
    for (const l of locks) lb.append(lockRow(l));
    $('locks-empty').hidden = locks.length > 0;
    $('locks-meta').textContent = s.locks_total > locks.length
      ? 'first ' + locks.length + ' of ' + s.locks_total + ' by name'
      : locks.length + (locks.length === 1 ? ' lock' : ' locks');
    tick();

    $('indexes').textContent = 'member ' + (self.id || '?') + ' · ' + (self.state || '?') + ' · commit ' +
      self.commit_index + ' · applied ' + self.applied_index;
    $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  }

  // kindOf names a lock's kind: "semaphore N" for a lock that admits N
  // holders, else its holders' mode; "—" for a free ordinary lock.
  function kindOf(l) {
    const limit = l.limit || 1;
    if (limit > 1) return 'semaphore ' + limit;
    return l.held && l.mode && l.mode !== 'none' ? l.mode : '—';
  }

  function line(cls, text) {
    return el('div', cls ? 'line ' + cls : 'line', text);
  }

  function lockRow(l) {
    const tr = el('tr');
    tr.dataset.lock = l.name;

    const name = el('td', 'name');
    name.append(el('span', 'mono', l.name));
    if (l.delayed_until) {
      const d = el('span', 'tag warn delay');
      name.append(d);
      st.delayCells.push([d, l.delayed_until]);
    }

    const limit = l.limit || 1;
    const total = l.holders_total || 0;
    const kind = el('td', 'kind');
    const kt = kindOf(l);
    kind.append(el('span', kt === '—' ? 'kind-name muted' : 'kind-name', kt));
    if (limit > 1) kind.append(el('span', 'sub', total + ' of ' + limit + ' held'));
    else if (l.held && l.mode === 'shared') kind.append(el('span', 'sub', total + (total === 1 ? ' holder' : ' holders')));

    const holder = el('td', 'holder');
    const token = el('td', 'token num mono');
    const ttl = el('td', 'ttl num');
    const value = el('td', 'value');
    const holders = l.holders || [];
    if (!l.held || holders.length === 0) {
      const free = line('');
      free.append(el('span', 'muted', 'free'));
      holder.append(free);
      token.append(line('muted', '—'));
      ttl.append(line('muted', '—'));
      value.append(line('muted', '—'));
    }
    for (const h of holders) {
      const who = line('');
      who.append(el('span', 'mono', h.client_id));
      if (h.session) who.append(el('span', 'sess', 'session ' + h.session));
      holder.append(who);
      token.append(line('', h.fencing_token));
      if (!h.expires_at) {
        ttl.append(line('muted', 'session'));
      } else {
        const ln = line('');
        const text = el('span', 'left');
        const bar = el('span', 'bar');
        const fill = el('i');
        bar.append(fill);
        ln.append(text, bar);
        ttl.append(ln);
        st.ttlCells.push([text, fill, h.expires_at, h.ttl_ms || 0]);
      }
      if (h.value) {
        const v = line('mono', h.value + (h.value_truncated ? '…' : ''));
        v.title = h.value_truncated ? h.value + '… (cut: the value is longer)' : h.value;
        value.append(v);
      } else {
        value.append(line('muted', '—'));
      }
    }
    if (total > holders.length) holder.append(line('muted more', '+' + (total - holders.length) + ' more'));

    const q = el('td', 'queue num');
    if (l.waiters > 0) q.append(el('span', 'qbadge', l.waiters));
    else q.append(el('span', 'muted', '0'));
    tr.append(name, kind, holder, token, ttl, value, q);
    return tr;
  }

  // tick redraws the countdowns from the member's clock (now + offset).
  function tick() {
    const now = Date.now() + st.offset;
    for (const [d, until] of st.delayCells) {
      const left = until - now;
      d.textContent = left > 0 ? 'delayed for ' + fmtLeft(left) : 'delay ending';
    }
    for (const [text, fill, exp, ttl] of st.ttlCells) {
      const left = exp - now;
      text.textContent = fmtLeft(left);
      text.classList.toggle('soon', left < 5000);
      const frac = ttl > 0 ? Math.max(0, Math.min(1, left / ttl)) : 0;
      fill.style.width = (frac * 100).toFixed(1) + '%';
      fill.classList.toggle('soon', left < 5000);
    }
  }
  setInterval(tick, 200);

  connect(HOME);
})();
