// Narad web console: plain ES2020, no dependencies, no build step.
//
// It lists topics and their stats, charts produce and ack rates and backlog (sampled from
// the stats it reads anyway), replays single messages by partition and offset (never a
// leasing consume: it acks, nacks and cancels nothing), shows dead letters with their
// origin headers, and runs the admin actions (create, pause and resume, purge, redrive,
// delete), each behind a confirmation dialog and offered only when the caller's grants
// (GET /v1/whoami) allow it; the server checks every request anyway. Everything the API
// returns is rendered with text nodes, never as HTML.
'use strict';

(() => {
  // The API lives next to the console: `https://x/prod/console` → `/prod/v1/...`.
  const BASE = location.pathname.replace(/\/console(?:\/.*)?$/, '');
  const DETAIL_CONCURRENCY = 8;
  const USER_KEY = 'narad.user';
  const PASS_KEY = 'narad.pass';
  const POLL_MS = 2000; // how often the open page re-reads the stats it shows
  const HISTORY_MS = 5 * 60 * 1000; // how much of that the charts keep
  const MAX_POLLED_TOPICS = 100; // beyond this many topics the list is read once, not polled
  const DEAD_LETTERS_SHOWN = 25; // dead letters the dead-letter view replays at most
  const ORIGIN_HEADERS = [ // what the broker adds to a dead letter (docs/features.md, "Delays, headers and payloads")
    'narad-source-topic', 'narad-source-partition', 'narad-source-offset',
    'narad-source-subscription', 'narad-delivery-count', 'narad-produced-at',
    'narad-dead-lettered-at',
  ];

  const main = document.getElementById('main');
  const errorBox = document.getElementById('error');
  const errorText = document.getElementById('error-text');
  const noticeBox = document.getElementById('notice');
  const noticeText = document.getElementById('notice-text');
  const who = document.getElementById('who');
  const signOutButton = document.getElementById('sign-out');

  // All the console's state, in one place.
  const state = {
    // Bumped on every navigation; a load or poll that finishes for an older view is dropped.
    generation: 0,
    // GET /v1/whoami: {user, grants}; null when the server has no whoami (then every
    // button shows and the server's 403 decides); undefined before it is asked.
    me: undefined,
    // The last topic list read (names and settings), to know which topics are dead-letter
    // topics of others.
    topics: null,
    // Per topic: [{t, produced, settled, backlog}], the last HISTORY_MS of polls.
    samples: new Map(),
    // The next navigation keeps the notice (the action that showed it navigated).
    keepNotice: false,
  };

  // ---- DOM helpers -------------------------------------------------------------------

  // h('a', {href: '#/', class: 'x', testid: 'y', onclick: fn}, 'text', childNode, ...).
  // Strings become text nodes, so data is never parsed as HTML.
  function h(tag, attrs = {}, ...children) {
    return build(document.createElement(tag), attrs, children);
  }

  const SVG_NS = 'http://www.w3.org/2000/svg';
  // The same for SVG elements.
  function s(tag, attrs = {}, ...children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  function build(el, attrs, children) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'class') el.setAttribute('class', v);
      else if (k === 'testid') el.dataset.testid = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c != null && c !== false) el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  const num = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '—');

  function bytes(n) {
    if (typeof n !== 'number') return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = n;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
  }

  // 950 → "950 ms", 4000 → "4 s", 3723000 → "1 h 2 m": the two largest units.
  function duration(ms) {
    if (typeof ms !== 'number' || !Number.isFinite(ms)) return '—';
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const units = [['d', 86400], ['h', 3600], ['m', 60], ['s', 1]];
    let rest = Math.floor(ms / 1000);
    const parts = [];
    let used = 0;
    for (const [unit, size] of units) {
      const q = Math.floor(rest / size);
      rest %= size;
      if (q > 0 || used > 0) {
        used += 1;
        if (q > 0) parts.push(`${q} ${unit}`);
      }
      if (used === 2) break;
    }
    return parts.join(' ');
  }

  // A rate or count for a chart label: 0.35 → "0.35", 12.5 → "12.5", 1234 → "1,234".
  function figure(v) {
    if (typeof v !== 'number' || !Number.isFinite(v)) return '—';
    if (v === 0 || Math.abs(v) >= 100) return num(Math.round(v));
    return String(Number(v.toPrecision(Math.abs(v) >= 10 ? 3 : 2)));
  }

  const sum = (parts, field) => parts.reduce((acc, p) => acc + (Number(p[field]) || 0), 0);
  const topicHref = (name) => `#/topics/${encodeURIComponent(name)}`;
  const topicPath = (name) => `/v1/topics/${encodeURIComponent(name)}`;
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // ---- Messages ----------------------------------------------------------------------

  function showError(message) {
    errorText.textContent = message;
    errorBox.hidden = false;
  }

  function clearError() {
    errorText.textContent = '';
    errorBox.hidden = true;
  }

  // A success line (what an action did); it stays until dismissed or the next navigation.
  function showNotice(message) {
    noticeText.textContent = message;
    noticeBox.hidden = false;
  }

  function clearNotice() {
    noticeText.textContent = '';
    noticeBox.hidden = true;
  }

  document.getElementById('error-close').addEventListener('click', clearError);
  document.getElementById('notice-close').addEventListener('click', clearNotice);
  window.addEventListener('error', (e) => showError(`Console error: ${e.message}`));
  window.addEventListener('unhandledrejection', (e) =>
    showError(`Console error: ${e.reason?.message ?? e.reason}`));

  // ---- Credentials and API -----------------------------------------------------------

  function credentials() {
    const user = sessionStorage.getItem(USER_KEY);
    const pass = sessionStorage.getItem(PASS_KEY);
    return user != null && pass != null ? { user, pass } : null;
  }

  function basic({ user, pass }) {
    // btoa takes Latin-1 only: encode as UTF-8 first.
    let binary = '';
    for (const b of new TextEncoder().encode(`${user}:${pass}`)) binary += String.fromCharCode(b);
    return `Basic ${btoa(binary)}`;
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // Calls the API; resolves {status, data} (data null on 204), throws ApiError otherwise.
  // `json` is sent as a JSON body.
  async function api(path, { method = 'GET', body, json, creds = credentials() } = {}) {
    let res;
    const headers = { Accept: 'application/json', ...(creds ? { Authorization: basic(creds) } : {}) };
    if (json !== undefined) headers['Content-Type'] = 'application/json';
    try {
      res = await fetch(BASE + path, {
        method,
        body: json !== undefined ? JSON.stringify(json) : body,
        cache: 'no-store',
        // Credentials go in the header only; 'omit' also keeps the browser from
        // answering the 401's WWW-Authenticate with its own login dialog.
        credentials: 'omit',
        headers,
      });
    } catch (e) {
      throw new ApiError(0, 'network', `Network error: ${e.message}`);
    }
    if (res.status === 204) return { status: 204, data: null };
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!res.ok) {
      const err = data?.error;
      let message = err?.message ?? `HTTP ${res.status} ${res.statusText}`.trim();
      const retry = res.headers.get('Retry-After');
      if (res.status === 429 && retry) message += ` (retry in ${retry} s)`;
      throw new ApiError(res.status, err?.code ?? `http_${res.status}`, message);
    }
    if (data == null) throw new ApiError(res.status, 'bad_response', `${method} ${path}: the answer is not JSON`);
    return { status: res.status, data };
  }

  // An API failure in a view: a 401 means the stored credentials no longer work.
  function fail(err) {
    if (err instanceof ApiError && err.status === 401) {
      signOut();
      showError('The broker refused the stored credentials (401). Sign in again.');
    } else {
      showError(err.message || String(err));
    }
  }

  function signOut() {
    sessionStorage.removeItem(USER_KEY);
    sessionStorage.removeItem(PASS_KEY);
    state.generation += 1;
    state.me = undefined;
    state.topics = null;
    state.samples.clear();
    closeDialogs();
    showLogin();
  }

  signOutButton.addEventListener('click', () => {
    clearError();
    clearNotice();
    signOut();
  });

  // ---- Grants ------------------------------------------------------------------------

  // Asks the server who the caller is. A server without /v1/whoami (404) leaves state.me
  // null: every button shows and the server's answer decides. Another failure leaves it
  // undefined (the same, and asked again at the next navigation).
  async function loadMe() {
    try {
      const { data } = await api('/v1/whoami');
      state.me = { user: String(data.user), grants: Array.isArray(data.grants) ? data.grants : [] };
    } catch (err) {
      if (err.status === 401) throw err;
      state.me = err.status === 404 ? null : undefined;
    }
  }

  // A grant's `topics`: a name, or a prefix ending in `*` (`*` alone: every topic).
  function covers(pattern, topic) {
    return pattern.endsWith('*') ? topic.startsWith(pattern.slice(0, -1)) : pattern === topic;
  }

  // Whether the caller may do `action` ('produce', 'consume', 'admin') on `topic`.
  function may(action, topic) {
    if (!state.me) return true;
    return state.me.grants.some((g) => covers(String(g.topics), topic) && g.actions?.includes(action));
  }

  // "every right", or "consume: orders-*, billing; admin: orders-*".
  function grantsSummary(grants) {
    if (grants.some((g) => g.topics === '*' && ['produce', 'consume', 'admin'].every((a) => g.actions?.includes(a)))) {
      return 'every right';
    }
    if (grants.length === 0) return 'no grants';
    return ['produce', 'consume', 'admin'].map((a) => {
      const on = grants.filter((g) => g.actions?.includes(a)).map((g) => g.topics);
      return on.length ? `${a}: ${on.join(', ')}` : null;
    }).filter(Boolean).join('; ');
  }

  // The patterns the caller may do `action` on (['*'] when the server does not say).
  function patternsFor(action) {
    if (!state.me) return ['*'];
    return state.me.grants.filter((g) => g.actions?.includes(action)).map((g) => String(g.topics));
  }

  // ---- Samples (for the charts) ------------------------------------------------------

  // Remembers one GET /v1/topics/{name} answer as a sample at time t (ms).
  function record(name, topic, t = Date.now()) {
    const parts = topic.partitions ?? [];
    const sample = {
      t,
      // Messages ever produced: the partitions' next offsets.
      produced: sum(parts, 'next_offset'),
      // Messages ever settled (acked, dead-lettered, purged, cancelled): every offset
      // below the frontier, and those acked above it.
      settled: sum(parts, 'frontier') + sum(parts, 'acked_ahead'),
      backlog: sum(parts, 'available'),
    };
    let list = state.samples.get(name) ?? [];
    // Offsets went back: the topic was deleted and made again; its history is another's.
    const last = list[list.length - 1];
    if (last && (sample.produced < last.produced || sample.settled < last.settled)) list = [];
    list.push(sample);
    while (list.length > 0 && list[0].t < t - HISTORY_MS) list.shift();
    state.samples.set(name, list);
  }

  // Pure: samples → the charts' series, each [{t, v}]. A rate is the growth between two
  // samples per second, plotted at the later one.
  function series(samples) {
    const rate = (field) => samples.slice(1).map((b, i) => {
      const a = samples[i];
      const dt = (b.t - a.t) / 1000;
      return { t: b.t, v: dt > 0 ? Math.max(0, b[field] - a[field]) / dt : 0 };
    });
    return {
      produced: rate('produced'),
      acked: rate('settled'),
      backlog: samples.map((x) => ({ t: x.t, v: x.backlog })),
    };
  }

  // ---- Charts (pure: data → SVG) -----------------------------------------------------

  // The smallest of 1, 2, 2.5, 5 × 10^k at or above v (at least 1): the y axis's top.
  function niceCeil(v) {
    if (!(v > 1)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    return [1, 2, 2.5, 5, 10].map((m) => m * p).find((c) => c >= v);
  }

  // A line chart of points [{t, v}] (t in ms, sorted) over their own time span: y from 0
  // to a round top, labelled; the x axis from the first sample ("−4 m 58 s") to "now".
  // Returns a new <svg>; it reads and changes nothing else.
  function lineChart({ title, points, unit = '', width = 360, height = 150, testid }) {
    const pad = { left: 46, right: 10, top: 10, bottom: 22 };
    const w = width - pad.left - pad.right;
    const ht = height - pad.top - pad.bottom;
    const current = points.length > 0 ? points[points.length - 1].v : null;
    const top = niceCeil(Math.max(0, ...points.map((p) => p.v)));
    const t0 = points.length > 0 ? points[0].t : 0;
    const span = points.length > 1 ? points[points.length - 1].t - t0 : 0;
    const x = (t) => pad.left + (span > 0 ? ((t - t0) / span) * w : w);
    const y = (v) => pad.top + ht - (v / top) * ht;
    const described = current == null ? `${title}: no samples yet`
      : `${title}: now ${figure(current)}${unit}, at most ${figure(Math.max(...points.map((p) => p.v)))}${unit} over the last ${duration(span)}`;

    const grid = [0, 0.5, 1].map((f) => {
      const v = top * f;
      return s('g', { class: 'tick' },
        s('line', { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v) }),
        s('text', { x: pad.left - 6, y: y(v), 'text-anchor': 'end', 'dominant-baseline': 'middle' }, figure(v)));
    });
    const xLabels = s('g', { class: 'axis' },
      s('text', { x: pad.left, y: height - 6, 'text-anchor': 'start' }, span > 0 ? `−${duration(span)}` : ''),
      s('text', { x: width - pad.right, y: height - 6, 'text-anchor': 'end' }, 'now'));
    let line;
    if (points.length >= 2) {
      const coords = points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
      const area = `${x(t0).toFixed(1)},${y(0)} ${coords} ${x(points[points.length - 1].t).toFixed(1)},${y(0)}`;
      line = [s('polygon', { class: 'area', points: area }), s('polyline', { class: 'line', points: coords })];
    } else {
      line = s('text', { class: 'waiting', x: pad.left + w / 2, y: pad.top + ht / 2, 'text-anchor': 'middle' },
        'Collecting samples…');
    }
    return s('svg', {
      class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': described,
      'data-testid': testid, 'data-points': points.length,
    }, s('title', {}, described), grid, xLabels, line);
  }

  // A small line without axes, for the topic list. Returns a new <svg>.
  function sparkline({ title, points, width = 110, height = 24 }) {
    const top = Math.max(1, ...points.map((p) => p.v));
    const t0 = points.length > 0 ? points[0].t : 0;
    const span = points.length > 1 ? points[points.length - 1].t - t0 : 0;
    const x = (t) => (span > 0 ? 1 + ((t - t0) / span) * (width - 2) : width - 1);
    const y = (v) => height - 3 - (v / top) * (height - 6);
    const coords = points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
    return s('svg', {
      class: 'spark', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': title,
      'data-testid': 'sparkline', 'data-points': points.length,
    }, s('title', {}, title), points.length >= 2 ? s('polyline', { class: 'line', points: coords }) : null);
  }

  // The topic page's three charts for one topic's samples.
  function renderCharts(samples) {
    const { produced, acked, backlog } = series(samples);
    const card = (title, points, unit, testid, hint) => h('figure', { class: 'chart-card', title: hint },
      h('figcaption', {}, h('span', {}, title),
        h('strong', { testid: `${testid}-now` }, points.length ? `${figure(points[points.length - 1].v)}${unit}` : '—')),
      lineChart({ title, points, unit, testid }));
    return h('div', { class: 'charts', testid: 'charts' },
      card('Produced', produced, '/s', 'chart-produced', 'Messages produced per second (growth of the next offsets)'),
      card('Acked', acked, '/s', 'chart-acked', 'Messages settled per second: acked, dead-lettered, purged or cancelled (growth of frontier + acked ahead)'),
      card('Backlog', backlog, '', 'chart-backlog', 'Unsettled messages not in flight'));
  }

  // ---- Dialogs -----------------------------------------------------------------------

  function closeDialogs() {
    for (const d of document.querySelectorAll('dialog')) {
      if (d.open) d.close();
      d.remove();
    }
  }

  // A modal confirmation: `body` (nodes, may hold form fields), a Cancel and a confirm
  // button. On confirm it awaits run(); a resolved string closes the dialog and becomes
  // the page's notice, a thrown error stays in the dialog (the server's message).
  // Resolves when the dialog closes: true if the action ran.
  function confirmDialog({ title, body, confirmLabel, danger = false, testid, run }) {
    return new Promise((resolve) => {
      const problem = h('p', { class: 'dialog-error', testid: 'dialog-error', role: 'alert', hidden: true });
      const confirm = h('button', { type: 'submit', class: danger ? 'danger' : '', testid: 'dialog-confirm' }, confirmLabel);
      const cancel = h('button', { type: 'button', testid: 'dialog-cancel', onclick: () => dialog.close() }, 'Cancel');
      const form = h('form', { method: 'dialog' },
        h('h2', {}, title), body, problem, h('div', { class: 'dialog-buttons' }, cancel, confirm));
      const dialog = h('dialog', { testid, 'aria-label': title }, form);
      let done = false;
      form.addEventListener('submit', async (e) => {
        e.preventDefault();
        if (!form.reportValidity()) return;
        confirm.disabled = true;
        cancel.disabled = true;
        problem.hidden = true;
        try {
          const said = await run(form);
          done = true;
          dialog.close();
          if (said) showNotice(said);
        } catch (err) {
          if (err instanceof ApiError && err.status === 401) {
            dialog.close();
            fail(err);
            return;
          }
          problem.textContent = err instanceof ApiError && err.status
            ? `${err.message} (HTTP ${err.status}${err.code ? `, ${err.code}` : ''})` : (err.message || String(err));
          problem.hidden = false;
        } finally {
          confirm.disabled = false;
          cancel.disabled = false;
        }
      });
      dialog.addEventListener('close', () => {
        dialog.remove();
        resolve(done);
      });
      document.body.append(dialog);
      dialog.showModal();
      (form.querySelector('input, select, textarea') ?? confirm).focus();
    });
  }

  const field = (label, input, hint) => h('label', { class: 'field' }, h('span', {}, label), input,
    hint ? h('small', { class: 'muted' }, hint) : null);

  // ---- Actions -----------------------------------------------------------------------

  // Create topic: a name, partitions and the optional settings most often set.
  function createTopicDialog() {
    const admin = patternsFor('admin');
    const prefix = admin.find((p) => p !== '*' && p.endsWith('*'))?.slice(0, -1) ?? '';
    const name = h('input', { name: 'name', testid: 'create-name', required: true, pattern: '[A-Za-z0-9_\\-][A-Za-z0-9._\\-]*', maxlength: '200', value: prefix, autocomplete: 'off' });
    const partitions = h('input', { name: 'partitions', testid: 'create-partitions', type: 'number', min: '1', max: '256', value: '1', required: true });
    const visibility = h('input', { name: 'visibility', testid: 'create-visibility', type: 'number', min: '100', placeholder: '30000' });
    const maxDeliveries = h('input', { name: 'max_deliveries', testid: 'create-max-deliveries', type: 'number', min: '0', max: '1000', placeholder: '0 (no limit)' });
    const deadLetter = h('input', { name: 'dead_letter_topic', testid: 'create-dead-letter-topic', placeholder: 'none', autocomplete: 'off' });
    const ordering = h('select', { name: 'ordering', testid: 'create-ordering' },
      h('option', { value: 'none' }, 'none'), h('option', { value: 'key' }, 'key (one at a time per key)'));
    const grantsHint = state.me && !admin.includes('*')
      ? h('p', { class: 'muted', testid: 'create-grants' }, `You may create topics matching: ${admin.join(', ')}.`) : null;
    return confirmDialog({
      title: 'Create topic',
      testid: 'dialog-create',
      confirmLabel: 'Create',
      body: [
        grantsHint,
        h('div', { class: 'grid' },
          field('Name', name, 'A–Z a–z 0–9 . _ -'),
          field('Partitions', partitions, '1–256; cannot change later'),
          field('Visibility timeout (ms)', visibility),
          field('Max deliveries', maxDeliveries, 'then the message is dead-lettered'),
          field('Dead-letter topic', deadLetter, 'needs admin on it too'),
          field('Ordering', ordering)),
      ],
      run: async () => {
        const settings = { partitions: Number(partitions.value) };
        if (visibility.value) settings.visibility_timeout_ms = Number(visibility.value);
        if (maxDeliveries.value) settings.max_deliveries = Number(maxDeliveries.value);
        if (deadLetter.value.trim()) settings.dead_letter_topic = deadLetter.value.trim();
        if (ordering.value !== 'none') settings.ordering = ordering.value;
        const topic = name.value.trim();
        const { status } = await api(topicPath(topic), { method: 'PUT', json: settings });
        state.topics = null;
        navigate(topicHref(topic));
        return status === 201 ? `Created topic ${topic}.` : `Topic ${topic} already exists with these settings.`;
      },
    });
  }

  function pauseDialog(topic, pause, after) {
    return confirmDialog({
      title: pause ? `Pause ${topic}?` : `Resume ${topic}?`,
      testid: pause ? 'dialog-pause' : 'dialog-resume',
      confirmLabel: pause ? 'Pause' : 'Resume',
      body: h('p', {}, pause
        ? 'Consumers get nothing (204 with Narad-Paused: true) until it is resumed. Produce, ack and replay go on.'
        : 'Consumers get messages again.'),
      run: async () => {
        await api(topicPath(topic), { method: 'PATCH', json: { paused: pause } });
        after();
        return pause ? `Paused ${topic}.` : `Resumed ${topic}.`;
      },
    });
  }

  // `current` is the topic's latest stats.
  function purgeDialog(topic, current, after) {
    const parts = current.partitions ?? [];
    const retained = parts.reduce((n, p) => n + (p.next_offset - p.start_offset), 0);
    return confirmDialog({
      title: `Purge ${topic}?`,
      testid: 'dialog-purge',
      confirmLabel: 'Purge',
      danger: true,
      body: [
        h('p', {}, `This removes every retained message (${num(retained)} now, ${num(unsettledOf(current))} of them unsettled), available and in flight. `
          + 'Outstanding receipt handles then get 410; new produces continue from the next offset.'),
        h('p', { class: 'muted' }, 'It cannot be undone.'),
      ],
      run: async () => {
        const { data } = await api(`${topicPath(topic)}/purge`, { method: 'POST' });
        after();
        return `Purged ${topic}: ${num(data.purged)} retained message${data.purged === 1 ? '' : 's'} removed.`;
      },
    });
  }

  function redriveDialog(topic, unsettled, after) {
    const max = h('input', { name: 'max', testid: 'redrive-max', type: 'number', min: '1', max: '1000', value: '1000', required: true });
    return confirmDialog({
      title: `Redrive ${topic}?`,
      testid: 'dialog-redrive',
      confirmLabel: 'Redrive',
      body: [
        h('p', {}, `${num(unsettled)} unsettled message${unsettled === 1 ? '' : 's'} here. `
          + 'Redrive moves dead letters back to the topic (and subscription) each came from, named by its narad-source-topic header, and removes them here. '
          + 'A message with no origin, or whose topic is gone, stays and counts as failed.'),
        field('At most', max, '1–1000 messages'),
      ],
      run: async () => {
        const { data } = await api(`${topicPath(topic)}/redrive?${new URLSearchParams({ max: max.value })}`, { method: 'POST' });
        after();
        return `Redrive of ${topic}: ${num(data.moved)} moved back, ${num(data.failed)} failed.`;
      },
    });
  }

  function deleteDialog(topic) {
    const typed = h('input', { name: 'confirm-name', testid: 'delete-confirm-name', required: true, autocomplete: 'off' });
    return confirmDialog({
      title: `Delete ${topic}?`,
      testid: 'dialog-delete',
      confirmLabel: 'Delete topic',
      danger: true,
      body: [
        h('p', {}, 'The topic, its subscriptions and every message go. It cannot be undone.'),
        field('Type the topic’s name to confirm', typed),
      ],
      run: async () => {
        if (typed.value !== topic) throw new Error('The name typed does not match.');
        await api(topicPath(topic), { method: 'DELETE' });
        state.samples.delete(topic);
        state.topics = null;
        navigate('#/');
        return `Deleted topic ${topic}.`;
      },
    });
  }

  // ---- Login -------------------------------------------------------------------------

  function showLogin() {
    who.textContent = '';
    signOutButton.hidden = true;
    const user = h('input', { id: 'login-user', name: 'username', testid: 'login-user', autocomplete: 'username', required: true });
    const pass = h('input', { id: 'login-pass', name: 'password', type: 'password', testid: 'login-pass', autocomplete: 'current-password', required: true });
    const submit = h('button', { type: 'submit', id: 'login-submit', testid: 'login-submit' }, 'Sign in');
    const form = h('form', { id: 'login-form', testid: 'login-form' },
      h('label', {}, 'User', user),
      h('label', {}, 'Password', pass),
      submit);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      clearError();
      const creds = { user: user.value, pass: pass.value };
      submit.disabled = true;
      try {
        await api('/v1/topics?limit=1', { creds });
        sessionStorage.setItem(USER_KEY, creds.user);
        sessionStorage.setItem(PASS_KEY, creds.pass);
        route();
      } catch (err) {
        showError(err.status === 401 ? 'Wrong user or password (401).' : `Sign-in failed: ${err.message}`);
        submit.disabled = false;
        pass.select();
      }
    });
    main.replaceChildren(h('section', { class: 'card login' },
      h('h1', {}, 'Sign in'),
      h('p', { class: 'muted' }, 'Use a broker user. The password is kept in this tab only (sessionStorage).'),
      form));
    user.focus();
  }

  // ---- Polling -----------------------------------------------------------------------

  // Calls tick() every POLL_MS (after the previous one ends) while the view is live and
  // the tab visible. A failed tick's error goes when a later one succeeds; a 401 or 404
  // (the topic was deleted) ends the polling.
  async function poll(live, tick) {
    let shown = null;
    while (live()) {
      await sleep(POLL_MS);
      if (!live()) return;
      if (document.hidden) continue;
      try {
        await tick();
        if (shown != null && errorText.textContent === shown) clearError();
        shown = null;
      } catch (err) {
        if (!live()) return;
        fail(err);
        shown = errorText.textContent;
        if (err.status === 401 || err.status === 404) return;
      }
    }
  }

  // Every topic the caller sees, all pages.
  async function listTopics() {
    const topics = [];
    let after = null;
    do {
      const q = new URLSearchParams({ limit: '100' });
      if (after != null) q.set('after', after);
      const { data } = await api(`/v1/topics?${q}`);
      topics.push(...data.topics);
      after = data.next ?? null;
    } while (after != null);
    state.topics = topics;
    return topics;
  }

  // ---- Topics page -------------------------------------------------------------------

  async function showTopics(live) {
    const status = h('p', { class: 'muted', testid: 'topics-status' }, 'Loading topics…');
    const tbody = h('tbody');
    const refresh = h('button', { type: 'button', id: 'refresh', testid: 'refresh', onclick: () => route() }, 'Refresh');
    const create = patternsFor('admin').length > 0
      ? h('button', { type: 'button', class: 'primary', testid: 'action-create', onclick: () => createTopicDialog() }, 'New topic…')
      : null;
    main.replaceChildren(h('section', {},
      h('div', { class: 'head' }, h('h1', {}, 'Topics'), h('div', { class: 'actions' }, create, refresh)),
      status,
      h('div', { class: 'scroll' }, h('table', { id: 'topics-table', testid: 'topics-table' },
        h('thead', {}, h('tr', {},
          h('th', {}, 'Topic'),
          h('th', { class: 'num' }, 'Partitions'),
          h('th', { class: 'num', title: 'Unsettled messages not in flight' }, 'Backlog'),
          h('th', { title: 'Backlog over the last minutes, sampled while this page is open' }, 'Backlog trend'),
          h('th', { class: 'num' }, 'In flight'),
          h('th', { class: 'num', title: 'Offsets acked above the frontier' }, 'Acked ahead'),
          h('th', { class: 'num' }, 'Bytes'))),
        tbody))));

    let topics;
    try {
      topics = await listTopics();
    } catch (err) {
      if (live()) {
        status.textContent = 'Could not list topics.';
        fail(err);
      }
      return;
    }
    if (!live()) return;
    if (topics.length === 0) {
      status.textContent = 'No topics yet.';
      return;
    }
    status.textContent = `${num(topics.length)} topic${topics.length === 1 ? '' : 's'}; loading stats…`;

    const rows = topics.map((t) => {
      const cells = {
        backlog: h('td', { class: 'num', testid: 'backlog' }, '…'),
        trend: h('td', { class: 'trend', testid: 'trend' }),
        inFlight: h('td', { class: 'num', testid: 'in-flight' }, '…'),
        ackedAhead: h('td', { class: 'num', testid: 'acked-ahead' }, '…'),
        bytes: h('td', { class: 'num', testid: 'bytes' }, '…'),
      };
      const dlqOf = topics.filter((o) => o.settings?.dead_letter_topic === t.name).map((o) => o.name);
      tbody.append(h('tr', { testid: 'topic-row', 'data-topic': t.name },
        h('td', {},
          h('a', { href: topicHref(t.name), class: 'topic-link' }, t.name),
          t.settings?.paused ? h('span', { class: 'badge', testid: 'paused-badge' }, 'paused') : null,
          dlqOf.length ? h('span', { class: 'badge dlq', title: `Dead-letter topic of ${dlqOf.join(', ')}` }, 'dead letters') : null),
        h('td', { class: 'num', testid: 'partitions' }, num(t.settings?.partitions)),
        cells.backlog, cells.trend, cells.inFlight, cells.ackedAhead, cells.bytes));
      return { name: t.name, cells };
    });

    const failures = await loadRowStats(rows, live);
    if (!live()) return;
    const polled = topics.length <= MAX_POLLED_TOPICS;
    status.textContent = `${num(topics.length)} topic${topics.length === 1 ? '' : 's'}.`
      + (polled ? ` Stats refresh every ${POLL_MS / 1000} s.` : ' Too many to refresh live: use Refresh.');
    if (failures.length > 0) showError(`Could not load stats for ${failures.length} topic(s). First: ${failures[0]}`);
    if (polled) {
      poll(live, async () => {
        const again = await loadRowStats(rows, live);
        if (again.length > 0 && live()) showError(`Could not load stats for ${again.length} topic(s). First: ${again[0]}`);
      });
    }
  }

  // Reads each row's topic stats (a few at a time), records a sample and fills the row.
  // Resolves the failures ("name: message"); rejects on a 401.
  async function loadRowStats(rows, live) {
    const failures = [];
    await pool(rows, DETAIL_CONCURRENCY, async ({ name, cells }) => {
      if (!live()) return;
      try {
        const { data } = await api(topicPath(name));
        if (!live()) return;
        record(name, data);
        fillRow(cells, name, data);
      } catch (err) {
        if (!live()) return;
        if (err.status === 401) throw err;
        failures.push(`${name}: ${err.message}`);
        for (const c of Object.values(cells)) {
          c.textContent = '!';
          c.title = err.message;
        }
      }
    }).catch((err) => live() && fail(err));
    return failures;
  }

  function fillRow(cells, name, data) {
    const parts = data.partitions ?? [];
    cells.backlog.textContent = num(sum(parts, 'available'));
    cells.inFlight.textContent = num(sum(parts, 'in_flight'));
    cells.ackedAhead.textContent = num(sum(parts, 'acked_ahead'));
    const total = sum(parts, 'bytes');
    cells.bytes.textContent = bytes(total);
    cells.bytes.title = `${num(total)} bytes`;
    const { backlog } = series(state.samples.get(name) ?? []);
    const top = Math.max(0, ...backlog.map((p) => p.v));
    cells.trend.replaceChildren(sparkline({
      title: `Backlog of ${name} over the last ${duration(backlog.length > 1 ? backlog[backlog.length - 1].t - backlog[0].t : 0)}: now ${num(sum(parts, 'available'))}, at most ${num(top)}`,
      points: backlog,
    }));
  }

  // Runs fn over items, at most `limit` at a time; rejects on the first rejection.
  async function pool(items, limit, fn) {
    let next = 0;
    const worker = async () => {
      while (next < items.length) await fn(items[next++]);
    };
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  }

  // ---- Topic page --------------------------------------------------------------------

  async function showTopic(name, live) {
    let topic = null; // the latest GET /v1/topics/{name}
    let actionsKey = null; // what the action buttons were drawn for
    let deadLetterKey = null; // the offsets the dead-letter view was read at
    let probed = null; // whether the message at the frontier has an origin header (asked once)
    const actions = h('div', { class: 'actions', testid: 'topic-actions' });
    const meta = h('p', { class: 'meta', testid: 'topic-meta' });
    const charts = h('div', { id: 'topic-charts' });
    const stats = h('div', { id: 'topic-stats' }, h('p', { class: 'muted' }, 'Loading…'));
    const subs = h('div', { id: 'subscriptions', testid: 'subscriptions' });
    const deadLetters = h('section', { id: 'dead-letters', testid: 'dead-letters', hidden: true });
    const refresh = h('button', { type: 'button', id: 'refresh', testid: 'refresh', onclick: () => load() }, 'Refresh');
    const peek = peekSection(name, () => topic, live);
    const produce = may('produce', name) ? produceSection(name, live, (at) => {
      peek.open(at.partition, at.offset);
      load();
    }) : null;

    main.replaceChildren(h('section', {},
      h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Topics'), ' / '),
      h('div', { class: 'head' }, h('h1', { testid: 'topic-name' }, name), h('div', { class: 'actions' }, actions, refresh)),
      meta,
      charts,
      deadLetters,
      stats,
      h('h2', {}, 'Subscriptions'),
      subs,
      may('consume', name) ? peek.section
        : [h('h2', {}, 'Peek'), h('p', { class: 'muted', testid: 'peek-not-allowed' }, 'Replaying messages needs the consume grant on this topic.')],
      produce));

    // Redraws what the stats show; the forms, actions and dead letters only when theirs changed.
    async function show(data) {
      const first = topic == null;
      topic = data;
      record(name, data);
      const isDeadLetterTopic = await deadLetterRole();
      if (!live()) return;
      const sources = (state.topics ?? []).filter((t) => t.settings?.dead_letter_topic === name).map((t) => t.name);
      meta.replaceChildren(...renderMeta(data, sources));
      charts.replaceChildren(renderCharts(state.samples.get(name) ?? []));
      stats.replaceChildren(renderTopic(data));
      peek.sync(first);
      const key = JSON.stringify([data.settings?.paused, isDeadLetterTopic]);
      if (key !== actionsKey) {
        actionsKey = key;
        actions.replaceChildren(...actionButtons(name, () => topic, isDeadLetterTopic, load));
        actions.dataset.ready = 'true';
      }
      const offsets = JSON.stringify((data.partitions ?? []).map((p) => [p.frontier, p.next_offset, p.acked_ahead]));
      if (isDeadLetterTopic && may('consume', name) && offsets !== deadLetterKey) {
        deadLetterKey = offsets;
        await showDeadLetters(name, data, deadLetters, live);
      }
    }

    // Whether this topic is another's dead-letter topic (by the last topic list read), or
    // held a message with an origin header at its frontier when the page opened.
    async function deadLetterRole() {
      if (!state.topics) state.topics = (await api('/v1/topics?limit=100')).data.topics;
      if (state.topics.some((t) => t.settings?.dead_letter_topic === name)) return true;
      if (probed == null) {
        const p = (topic.partitions ?? []).find((x) => x.frontier < x.next_offset);
        const m = p && may('consume', name) ? await replay(name, p.partition, p.frontier) : null;
        probed = m?.headers?.['narad-source-topic'] != null;
      }
      return probed;
    }

    async function load() {
      refresh.disabled = true;
      try {
        const { data } = await api(topicPath(name));
        if (!live()) return;
        await show(data);
        await loadSubscriptions(name, subs, live);
      } catch (err) {
        if (!live()) return;
        if (topic == null) {
          stats.replaceChildren(h('p', { class: 'note' },
            err.status === 404 ? `No topic named “${name}”.` : 'Could not load this topic.'));
        }
        fail(err);
      } finally {
        refresh.disabled = false;
      }
    }

    await load();
    if (topic != null) {
      poll(live, async () => {
        const { data } = await api(topicPath(name));
        if (live()) await show(data);
      });
    }
  }

  // Messages neither acked nor otherwise settled, over the partitions.
  const unsettledOf = (topic) => (topic.partitions ?? [])
    .reduce((n, p) => n + (p.next_offset - p.frontier - p.acked_ahead), 0);

  // The topic page's buttons the caller's grants allow (admin for every one of them);
  // current() is the topic's latest stats.
  function actionButtons(name, current, isDeadLetterTopic, reload) {
    if (!may('admin', name)) return [];
    const paused = Boolean(current().settings?.paused);
    return [
      isDeadLetterTopic ? h('button', { type: 'button', class: 'primary', testid: 'action-redrive', onclick: () => redriveDialog(name, unsettledOf(current()), reload) }, 'Redrive…') : null,
      paused
        ? h('button', { type: 'button', testid: 'action-resume', onclick: () => pauseDialog(name, false, reload) }, 'Resume…')
        : h('button', { type: 'button', testid: 'action-pause', onclick: () => pauseDialog(name, true, reload) }, 'Pause…'),
      h('button', { type: 'button', class: 'danger', testid: 'action-purge', onclick: () => purgeDialog(name, current(), reload) }, 'Purge…'),
      h('button', { type: 'button', class: 'danger', testid: 'action-delete', onclick: () => deleteDialog(name) }, 'Delete…'),
    ].filter(Boolean);
  }

  // Every subscription with its figures summed over the partitions (one GET each, a few
  // at a time).
  async function loadSubscriptions(name, subs, live) {
    const { data } = await api(`${topicPath(name)}/subscriptions`);
    if (!live()) return;
    const list = data.subscriptions ?? [];
    const full = new Map();
    await pool(list, 4, async (sub) => {
      const { data: one } = await api(`${topicPath(name)}/subscriptions/${encodeURIComponent(sub.name)}`);
      full.set(sub.name, one);
    });
    if (!live()) return;
    subs.replaceChildren(list.length === 0
      ? h('p', { class: 'muted', testid: 'no-subscriptions' },
        'None besides the topic\'s own. Each subscription gets every message, with its own leases and acks.')
      : renderSubscriptions(list.map((sub) => full.get(sub.name) ?? sub)));
  }

  // One retained message by position (read-only), or null when there is none (204) or
  // retention removed it (410).
  async function replay(name, partition, offset) {
    try {
      const q = new URLSearchParams({ partition: String(partition), offset: String(offset) });
      const { status, data } = await api(`${topicPath(name)}/consume?${q}`);
      return status === 204 ? null : data;
    } catch (err) {
      if (err.status === 410) return null;
      throw err;
    }
  }

  // Peek: a read-only replay of one message by partition and offset. Returns the section,
  // open(partition, offset), and sync(first) to call when the topic's stats change.
  function peekSection(name, currentTopic, live) {
    const partition = h('select', { id: 'peek-partition', testid: 'peek-partition' });
    const offset = h('input', { id: 'peek-offset', testid: 'peek-offset', type: 'number', min: '0', step: '1', required: true });
    const out = h('div', { id: 'peek-message', testid: 'peek-message', class: 'peek', 'aria-live': 'polite' });
    const prev = h('button', { type: 'button', testid: 'peek-prev', onclick: () => step(-1) }, '← Previous offset');
    const next = h('button', { type: 'button', testid: 'peek-next', onclick: () => step(1) }, 'Next offset →');
    const form = h('form', { id: 'peek-form', class: 'inline' },
      h('label', {}, 'Partition', partition),
      h('label', {}, 'Offset', offset),
      h('button', { type: 'submit', id: 'peek-open', testid: 'peek-open' }, 'Open'),
      prev, next);
    partition.addEventListener('change', () => {
      offset.value = defaultOffset(Number(partition.value));
    });
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      read();
    });

    function defaultOffset(p) {
      const stats = currentTopic()?.partitions?.find((x) => x.partition === p);
      if (!stats) return '0';
      // The oldest unsettled message if there is one, else the oldest retained.
      return String(stats.frontier < stats.next_offset ? stats.frontier : stats.start_offset);
    }

    function step(delta) {
      const current = Number(offset.value);
      const target = Number.isSafeInteger(current) ? current + delta : 0;
      if (target < 0) return;
      offset.value = String(target);
      read();
    }

    async function read() {
      const p = partition.value;
      const o = offset.value.trim();
      if (p === '' || !/^\d+$/.test(o)) {
        out.replaceChildren(h('p', { class: 'note' }, 'Choose a partition and a whole-number offset.'));
        return;
      }
      clearError();
      prev.disabled = o === '0';
      out.replaceChildren(h('p', { class: 'muted' }, 'Reading…'));
      const q = new URLSearchParams({ partition: p, offset: o });
      try {
        const { status, data } = await api(`${topicPath(name)}/consume?${q}`);
        if (!live()) return;
        out.replaceChildren(status === 204
          ? h('p', { class: 'note' }, `Nothing at partition ${p}, offset ${o} yet.`)
          : renderMessage(data));
      } catch (err) {
        if (!live()) return;
        if (err.status === 410 || err.code === 'offset_expired') {
          out.replaceChildren(h('p', { class: 'note' },
            `Offset ${o} of partition ${p} has expired (removed by retention).`));
        } else {
          out.replaceChildren();
          fail(err);
        }
      }
    }

    // Keeps the partition choices in step with the topic; the first time, the offset too.
    function sync(first) {
      const chosen = partition.value;
      const ids = (currentTopic()?.partitions ?? []).map((p) => String(p.partition));
      if (ids.join() !== [...partition.options].map((o) => o.value).join()) {
        partition.replaceChildren(...ids.map((id) => h('option', { value: id }, id)));
        if (ids.includes(chosen)) partition.value = chosen;
      }
      if (first) offset.value = defaultOffset(Number(partition.value));
    }

    const section = [
      h('h2', {}, 'Peek'),
      h('p', { class: 'muted' }, 'Reads one message by partition and offset. Read-only: it leases nothing.'),
      form,
      out,
    ];
    return {
      section,
      sync,
      open(p, o) {
        partition.value = String(p);
        offset.value = String(o);
        read();
      },
    };
  }

  // Produce: writes one test message; calls produced({partition, offset}) after.
  function produceSection(name, live, produced) {
    const body = h('textarea', { id: 'produce-body', testid: 'produce-body', rows: '4', placeholder: '{"hello": "world"}' });
    const key = h('input', { id: 'produce-key', testid: 'produce-key', placeholder: 'optional' });
    const send = h('button', { type: 'submit', id: 'produce-send', testid: 'produce-send' }, 'Produce');
    const result = h('div', { id: 'produce-result', testid: 'produce-result', class: 'result', 'aria-live': 'polite' });
    const form = h('form', { id: 'produce-form', testid: 'produce-form' },
      h('label', { class: 'block' }, 'Message body (sent as-is)', body),
      h('div', { class: 'inline' }, h('label', {}, 'Key', key), send),
      result);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      clearError();
      send.disabled = true;
      result.textContent = 'Producing…';
      try {
        const q = key.value ? `?${new URLSearchParams({ key: key.value })}` : '';
        const { data } = await api(`${topicPath(name)}/produce${q}`, { method: 'POST', body: body.value });
        if (!live()) return;
        result.replaceChildren(
          `Produced to partition ${data.partition}, offset ${data.offset}. `,
          h('button', {
            type: 'button', class: 'link', testid: 'produce-peek',
            onclick: () => produced(data),
          }, 'Peek it'));
      } catch (err) {
        if (!live()) return;
        result.textContent = '';
        fail(err);
      } finally {
        send.disabled = false;
      }
    });
    return [h('h2', {}, 'Produce a test message'), form];
  }

  // ---- Dead letters ------------------------------------------------------------------

  // Replays the unsettled messages of a dead-letter topic (up to DEAD_LETTERS_SHOWN, read-
  // only) into `box`, each with its origin headers.
  async function showDeadLetters(name, topic, box, live) {
    const wanted = [];
    for (const p of topic.partitions ?? []) {
      for (let o = p.frontier; o < p.next_offset && wanted.length < DEAD_LETTERS_SHOWN; o += 1) {
        wanted.push([p.partition, o]);
      }
    }
    const found = [];
    await pool(wanted, 4, async ([p, o]) => {
      const m = await replay(name, p, o);
      if (m) found.push(m);
    });
    if (!live()) return;
    found.sort((a, b) => a.partition - b.partition || a.offset - b.offset);
    const unsettled = unsettledOf(topic);
    box.hidden = false;
    box.replaceChildren(
      h('h2', {}, 'Dead letters'),
      h('p', { class: 'muted', testid: 'dead-letters-status' },
        found.length === 0 ? 'No dead letters: every message here is settled.'
          : `${num(unsettled)} unsettled; the ${found.length === 1 ? 'oldest' : `oldest ${found.length}`} shown, replayed read-only. `
            + 'Redrive moves them back to where they came from.'),
      found.length === 0 ? null : renderDeadLetters(found));
  }

  function renderDeadLetters(messages) {
    const origin = (m, k) => m.headers?.[k] ?? '—';
    return h('div', { class: 'scroll' }, h('table', { testid: 'dead-letters-table' },
      h('thead', {}, h('tr', {},
        ...['Here', 'Source topic', 'Source partition / offset', 'Subscription', 'Deliveries',
          'Produced at', 'Dead-lettered at', 'Other headers', 'Payload'].map((l) => h('th', {}, l)))),
      h('tbody', {}, messages.map((m) => {
        const source = m.headers?.['narad-source-topic'];
        const others = Object.entries(m.headers ?? {}).filter(([k]) => !ORIGIN_HEADERS.includes(k));
        return h('tr', { testid: 'dead-letter-row', 'data-partition': m.partition, 'data-offset': m.offset },
          h('td', { class: 'num' }, `${m.partition} / ${m.offset}`),
          h('td', { testid: 'dl-source-topic' }, source ? h('a', { href: topicHref(source) }, source) : '— (not a dead letter)'),
          h('td', { class: 'num', testid: 'dl-source-position' },
            `${origin(m, 'narad-source-partition')} / ${origin(m, 'narad-source-offset')}`),
          h('td', { testid: 'dl-source-subscription' }, m.headers?.['narad-source-subscription'] ?? '(default)'),
          h('td', { class: 'num', testid: 'dl-delivery-count' }, origin(m, 'narad-delivery-count')),
          h('td', { testid: 'dl-produced-at' }, origin(m, 'narad-produced-at')),
          h('td', { testid: 'dl-dead-lettered-at' }, origin(m, 'narad-dead-lettered-at')),
          h('td', {}, others.length ? others.map(([k, v]) => h('div', {}, h('code', {}, k), `: ${v}`)) : '—'),
          h('td', { class: 'preview', testid: 'dl-payload' }, preview(m)));
      }))));
  }

  function preview(m) {
    const text = m.payload_encoding === 'base64' ? `(base64) ${m.payload}`
      : typeof m.payload === 'string' ? m.payload : JSON.stringify(m.payload);
    return text.length > 80 ? `${text.slice(0, 80)}…` : text;
  }

  // ---- Rendering ---------------------------------------------------------------------

  // The line under the topic's name: paused, created, its dead-letter topic, the topics
  // (`sources`) it is the dead-letter topic of.
  function renderMeta(t, sources) {
    const dlt = t.settings?.dead_letter_topic;
    const links = sources.map((n, i) => [i > 0 ? ', ' : '', h('a', { href: topicHref(n) }, n)]);
    return [
      t.settings?.paused ? [h('span', { class: 'badge', testid: 'paused-badge' }, 'paused'), ' '] : null,
      `Created ${t.created_at ?? '—'}`,
      dlt ? [' · ', h('a', { href: topicHref(dlt), testid: 'dead-letter-topic' }, 'dead-letter topic'), ` (${dlt})`] : null,
      sources.length ? [' · the dead-letter topic of ', links] : null,
    ].flat(Infinity).filter(Boolean);
  }

  function renderTopic(t) {
    const st = t.settings ?? {};
    const settings = h('dl', { class: 'settings', testid: 'settings' });
    for (const [k, v] of Object.entries(st)) {
      let shown;
      if (k === 'dead_letter_topic') {
        shown = v == null ? 'none' : h('a', { href: topicHref(v), testid: 'dead-letter-link' }, v);
      } else if (k.endsWith('_ms') && typeof v === 'number') {
        shown = `${num(v)} ms (${duration(v)})`;
      } else {
        shown = typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v);
      }
      settings.append(h('div', { 'data-setting': k }, h('dt', {}, k.replace(/_/g, ' ')), h('dd', {}, shown)));
    }

    const parts = t.partitions ?? [];
    const numCell = (v, testid) => h('td', { class: 'num', testid }, num(v));
    const bytesCell = (v) => h('td', { class: 'num', testid: 'bytes', title: `${num(v)} bytes` }, bytes(v));
    const table = h('table', { id: 'partitions-table', testid: 'partitions-table' },
      h('thead', {}, h('tr', {},
        ...['Partition', 'Start offset', 'Frontier', 'Next offset', 'Backlog', 'In flight',
          'Acked ahead', 'Delayed', 'Oldest message age', 'Segments', 'Bytes']
          .map((label) => h('th', { class: label === 'Oldest message age' ? '' : 'num' }, label)))),
      h('tbody', {}, parts.map((p) => h('tr', { testid: 'partition-row', 'data-partition': p.partition },
        numCell(p.partition, 'partition'),
        numCell(p.start_offset, 'start-offset'),
        numCell(p.frontier, 'frontier'),
        numCell(p.next_offset, 'next-offset'),
        numCell(p.available, 'backlog'),
        numCell(p.in_flight, 'in-flight'),
        numCell(p.acked_ahead, 'acked-ahead'),
        numCell(p.delayed ?? 0, 'delayed'),
        ageCell(p),
        numCell(p.segments, 'segments'),
        bytesCell(p.bytes)))),
      h('tfoot', {}, h('tr', {},
        h('th', { colspan: '4' }, 'Total'),
        numCell(sum(parts, 'available'), 'total-backlog'),
        numCell(sum(parts, 'in_flight'), 'total-in-flight'),
        numCell(sum(parts, 'acked_ahead'), 'total-acked-ahead'),
        numCell(sum(parts, 'delayed'), 'total-delayed'),
        h('td'),
        numCell(sum(parts, 'segments'), 'total-segments'),
        bytesCell(sum(parts, 'bytes')))));

    return h('div', {},
      h('h2', {}, 'Partitions'),
      h('div', { class: 'scroll' }, table),
      h('h2', {}, 'Settings'),
      settings);
  }

  function renderSubscriptions(list) {
    const numCell = (v, testid) => h('td', { class: 'num', testid }, num(v));
    const oldest = (parts, f) => parts.reduce((m, p) =>
      (typeof p[f] === 'number' && (m == null || p[f] > m) ? p[f] : m), null);
    return h('div', { class: 'scroll' }, h('table', { id: 'subscriptions-table', testid: 'subscriptions-table' },
      h('thead', {}, h('tr', {},
        ...['Subscription', 'Start', 'Backlog', 'In flight', 'Acked ahead', 'Delayed', 'Lost',
          'Oldest message age', 'Visibility timeout', 'Paused']
          .map((label) => h('th', { class: ['Subscription', 'Start', 'Oldest message age', 'Paused'].includes(label) ? '' : 'num' }, label)))),
      h('tbody', {}, list.map((sub) => {
        const parts = sub.partitions ?? [];
        const e = sub.effective ?? {};
        return h('tr', { testid: 'subscription-row', 'data-subscription': sub.name },
          h('td', { testid: 'subscription-name' }, sub.name),
          h('td', {}, sub.start ?? '—'),
          numCell(sum(parts, 'available'), 'subscription-backlog'),
          numCell(sum(parts, 'in_flight'), 'subscription-in-flight'),
          numCell(sum(parts, 'acked_ahead'), 'subscription-acked-ahead'),
          numCell(sum(parts, 'delayed'), 'subscription-delayed'),
          numCell(sum(parts, 'lost'), 'subscription-lost'),
          ageCell({
            oldest_unsettled_age_ms: oldest(parts, 'oldest_unsettled_age_ms'),
            oldest_available_age_ms: oldest(parts, 'oldest_available_age_ms'),
          }),
          h('td', { class: 'num' }, typeof e.visibility_timeout_ms === 'number' ? duration(e.visibility_timeout_ms) : '—'),
          h('td', {}, e.paused ? 'yes' : 'no'));
      }))));
  }

  // Oldest message age, when the broker reports it (newer versions do).
  function ageCell(p) {
    const unsettled = p.oldest_unsettled_age_ms;
    const available = p.oldest_available_age_ms;
    const cell = h('td', { testid: 'oldest-age', title: 'Age of the oldest unsettled / oldest available message' });
    if (typeof unsettled === 'number') cell.append(h('div', {}, `${duration(unsettled)} unsettled`));
    if (typeof available === 'number') cell.append(h('div', {}, `${duration(available)} available`));
    if (!cell.hasChildNodes()) cell.textContent = '—';
    return cell;
  }

  function renderMessage(m) {
    let kind;
    let text;
    if (m.payload_encoding === 'base64') {
      let size = '?';
      try {
        size = num(atob(m.payload).length);
      } catch {
        // leave '?'
      }
      kind = `binary, ${size} bytes, shown as base64`;
      text = String(m.payload);
    } else if (typeof m.payload === 'string') {
      kind = 'text';
      text = m.payload;
    } else {
      kind = 'JSON';
      text = JSON.stringify(m.payload, null, 2);
    }
    const item = (label, value, testid) => h('div', {}, h('dt', {}, label), h('dd', { testid }, value));
    const headers = Object.entries(m.headers ?? {});
    return h('article', { class: 'message' },
      h('dl', { class: 'fields' },
        item('Partition', num(m.partition), 'peek-partition-value'),
        item('Offset', num(m.offset), 'peek-offset-value'),
        item('Key', m.key ?? '(none)', 'peek-key'),
        item('Produced at', m.produced_at ?? '—', 'peek-produced-at'),
        item('Delivery count', num(m.delivery_count), 'peek-delivery-count'),
        item('Payload', kind, 'peek-kind')),
      headers.length === 0 ? null : h('dl', { class: 'fields headers', testid: 'peek-headers' },
        headers.map(([k, v]) => h('div', { class: k.startsWith('narad-') ? 'origin' : '' },
          h('dt', {}, h('code', {}, k)), h('dd', { 'data-header': k }, v)))),
      h('pre', { class: 'payload', testid: 'peek-payload' }, text));
  }

  // ---- Routing -----------------------------------------------------------------------

  async function route() {
    clearError();
    closeDialogs();
    state.generation += 1;
    const mine = state.generation;
    const live = () => mine === state.generation;
    const creds = credentials();
    if (!creds) {
      showLogin();
      return;
    }
    who.textContent = `Signed in as ${creds.user}`;
    signOutButton.hidden = false;
    const m = location.hash.match(/^#\/topics\/(.+)$/);
    let name = null;
    if (m) {
      try {
        name = decodeURIComponent(m[1]);
      } catch {
        showError('That link has a malformed topic name.');
      }
    }
    try {
      if (state.me === undefined) await loadMe();
      if (!live()) return;
      who.textContent = `Signed in as ${state.me ? state.me.user : creds.user}`;
      who.title = state.me ? grantsSummary(state.me.grants) : 'This server does not say what the user may do (no /v1/whoami).';
      if (state.me) who.append(h('span', { class: 'grants', testid: 'grants' }, ` · ${grantsSummary(state.me.grants)}`));
      await (name != null ? showTopic(name, live) : showTopics(live));
    } catch (err) {
      if (live()) fail(err);
    }
  }

  // A navigation clears the last action's notice, unless the action itself navigated.
  function navigate(hash) {
    state.keepNotice = true;
    location.hash = hash;
  }

  window.addEventListener('hashchange', () => {
    if (!state.keepNotice) clearNotice();
    state.keepNotice = false;
    route();
  });
  route();
})();
