// Narad web console: plain ES2020, no dependencies, no build step.
//
// Read-only by design: it lists topics and their stats, replays single messages by
// partition and offset (never a leasing consume), and produces a test message only when
// asked to. Everything the API returns is rendered with text nodes, never as HTML.
'use strict';

(() => {
  // The API lives next to the console: `https://x/prod/console` → `/prod/v1/...`.
  const BASE = location.pathname.replace(/\/console(?:\/.*)?$/, '');
  const DETAIL_CONCURRENCY = 8;
  const USER_KEY = 'narad.user';
  const PASS_KEY = 'narad.pass';

  const main = document.getElementById('main');
  const errorBox = document.getElementById('error');
  const errorText = document.getElementById('error-text');
  const who = document.getElementById('who');
  const signOutButton = document.getElementById('sign-out');

  // Bumped on every navigation; a load that finishes for an older view is dropped.
  let generation = 0;

  // ---- DOM helpers -------------------------------------------------------------------

  // h('a', {href: '#/', class: 'x', testid: 'y', onclick: fn}, 'text', childNode, ...).
  // Strings become text nodes, so data is never parsed as HTML.
  function h(tag, attrs = {}, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
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
    let s = Math.floor(ms / 1000);
    const parts = [];
    let used = 0;
    for (const [unit, size] of units) {
      const q = Math.floor(s / size);
      s %= size;
      if (q > 0 || used > 0) {
        used += 1;
        if (q > 0) parts.push(`${q} ${unit}`);
      }
      if (used === 2) break;
    }
    return parts.join(' ');
  }

  const sum = (parts, field) => parts.reduce((acc, p) => acc + (Number(p[field]) || 0), 0);
  const topicHref = (name) => `#/topics/${encodeURIComponent(name)}`;
  const topicPath = (name) => `/v1/topics/${encodeURIComponent(name)}`;

  // ---- Messages ----------------------------------------------------------------------

  function showError(message) {
    errorText.textContent = message;
    errorBox.hidden = false;
  }

  function clearError() {
    errorText.textContent = '';
    errorBox.hidden = true;
  }

  document.getElementById('error-close').addEventListener('click', clearError);
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
  async function api(path, { method = 'GET', body, creds = credentials() } = {}) {
    let res;
    try {
      res = await fetch(BASE + path, {
        method,
        body,
        cache: 'no-store',
        // Credentials go in the header only; 'omit' also keeps the browser from
        // answering the 401's WWW-Authenticate with its own login dialog.
        credentials: 'omit',
        headers: { Accept: 'application/json', ...(creds ? { Authorization: basic(creds) } : {}) },
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
    generation += 1;
    showLogin();
  }

  signOutButton.addEventListener('click', () => {
    clearError();
    signOut();
  });

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

  // ---- Topics page -------------------------------------------------------------------

  async function showTopics(live) {
    const status = h('p', { class: 'muted', testid: 'topics-status' }, 'Loading topics…');
    const tbody = h('tbody');
    const refresh = h('button', { type: 'button', id: 'refresh', testid: 'refresh', onclick: () => route() }, 'Refresh');
    main.replaceChildren(h('section', {},
      h('div', { class: 'head' }, h('h1', {}, 'Topics'), refresh),
      status,
      h('table', { id: 'topics-table', testid: 'topics-table' },
        h('thead', {}, h('tr', {},
          h('th', {}, 'Topic'),
          h('th', { class: 'num' }, 'Partitions'),
          h('th', { class: 'num', title: 'Unsettled messages not in flight' }, 'Backlog'),
          h('th', { class: 'num' }, 'In flight'),
          h('th', { class: 'num', title: 'Offsets acked above the frontier' }, 'Acked ahead'),
          h('th', { class: 'num' }, 'Bytes'))),
        tbody)));

    const topics = [];
    try {
      let after = null;
      do {
        const q = new URLSearchParams({ limit: '100' });
        if (after != null) q.set('after', after);
        const { data } = await api(`/v1/topics?${q}`);
        if (!live()) return;
        topics.push(...data.topics);
        after = data.next ?? null;
      } while (after != null);
    } catch (err) {
      if (live()) {
        status.textContent = 'Could not list topics.';
        fail(err);
      }
      return;
    }

    if (topics.length === 0) {
      status.textContent = 'No topics yet.';
      return;
    }
    status.textContent = `${num(topics.length)} topic${topics.length === 1 ? '' : 's'}; loading stats…`;

    const rows = topics.map((t) => {
      const cells = {
        backlog: h('td', { class: 'num', testid: 'backlog' }, '…'),
        inFlight: h('td', { class: 'num', testid: 'in-flight' }, '…'),
        ackedAhead: h('td', { class: 'num', testid: 'acked-ahead' }, '…'),
        bytes: h('td', { class: 'num', testid: 'bytes' }, '…'),
      };
      tbody.append(h('tr', { testid: 'topic-row', 'data-topic': t.name },
        h('td', {}, h('a', { href: topicHref(t.name), class: 'topic-link' }, t.name)),
        h('td', { class: 'num', testid: 'partitions' }, num(t.settings?.partitions)),
        cells.backlog, cells.inFlight, cells.ackedAhead, cells.bytes));
      return { name: t.name, cells };
    });

    let failed = 0;
    let firstFailure = null;
    await pool(rows, DETAIL_CONCURRENCY, async ({ name, cells }) => {
      if (!live()) return;
      try {
        const { data } = await api(topicPath(name));
        if (!live()) return;
        const parts = data.partitions ?? [];
        cells.backlog.textContent = num(sum(parts, 'available'));
        cells.inFlight.textContent = num(sum(parts, 'in_flight'));
        cells.ackedAhead.textContent = num(sum(parts, 'acked_ahead'));
        const total = sum(parts, 'bytes');
        cells.bytes.textContent = bytes(total);
        cells.bytes.title = `${num(total)} bytes`;
      } catch (err) {
        if (!live()) return;
        if (err.status === 401) throw err;
        failed += 1;
        if (firstFailure == null) firstFailure = `${name}: ${err.message}`;
        for (const c of Object.values(cells)) {
          c.textContent = '!';
          c.title = err.message;
        }
      }
    }).catch((err) => live() && fail(err));

    if (!live()) return;
    status.textContent = `${num(topics.length)} topic${topics.length === 1 ? '' : 's'}.`;
    if (failed > 0) showError(`Could not load stats for ${failed} topic(s). First: ${firstFailure}`);
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
    const stats = h('div', { id: 'topic-stats' }, h('p', { class: 'muted' }, 'Loading…'));
    const subs = h('div', { id: 'subscriptions', testid: 'subscriptions' });
    const refresh = h('button', { type: 'button', id: 'refresh', testid: 'refresh', onclick: () => load() }, 'Refresh');

    // Peek: a read-only replay of one message by partition and offset.
    const peekPartition = h('select', { id: 'peek-partition', testid: 'peek-partition' });
    const peekOffset = h('input', { id: 'peek-offset', testid: 'peek-offset', type: 'number', min: '0', step: '1', required: true });
    const peekOut = h('div', { id: 'peek-message', testid: 'peek-message', class: 'peek', 'aria-live': 'polite' });
    const prev = h('button', { type: 'button', testid: 'peek-prev', onclick: () => step(-1) }, '← Previous offset');
    const next = h('button', { type: 'button', testid: 'peek-next', onclick: () => step(1) }, 'Next offset →');
    const peekForm = h('form', { id: 'peek-form', class: 'inline' },
      h('label', {}, 'Partition', peekPartition),
      h('label', {}, 'Offset', peekOffset),
      h('button', { type: 'submit', id: 'peek-open', testid: 'peek-open' }, 'Open'),
      prev, next);
    peekPartition.addEventListener('change', () => {
      peekOffset.value = defaultOffset(Number(peekPartition.value));
    });
    peekForm.addEventListener('submit', (e) => {
      e.preventDefault();
      peek();
    });

    // Produce: the one thing here that writes.
    const body = h('textarea', { id: 'produce-body', testid: 'produce-body', rows: '4', placeholder: '{"hello": "world"}' });
    const key = h('input', { id: 'produce-key', testid: 'produce-key', placeholder: 'optional' });
    const send = h('button', { type: 'submit', id: 'produce-send', testid: 'produce-send' }, 'Produce');
    const produced = h('div', { id: 'produce-result', testid: 'produce-result', class: 'result', 'aria-live': 'polite' });
    const produceForm = h('form', { id: 'produce-form' },
      h('label', { class: 'block' }, 'Message body (sent as-is)', body),
      h('div', { class: 'inline' }, h('label', {}, 'Key', key), send),
      produced);
    produceForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      clearError();
      send.disabled = true;
      produced.textContent = 'Producing…';
      try {
        const q = key.value ? `?${new URLSearchParams({ key: key.value })}` : '';
        const { data } = await api(`${topicPath(name)}/produce${q}`, { method: 'POST', body: body.value });
        if (!live()) return;
        produced.replaceChildren(
          `Produced to partition ${data.partition}, offset ${data.offset}. `,
          h('button', {
            type: 'button', class: 'link', testid: 'produce-peek',
            onclick: () => {
              peekPartition.value = String(data.partition);
              peekOffset.value = String(data.offset);
              peek();
            },
          }, 'Peek it'));
        load();
      } catch (err) {
        if (!live()) return;
        produced.textContent = '';
        fail(err);
      } finally {
        send.disabled = false;
      }
    });

    main.replaceChildren(h('section', {},
      h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Topics'), ' / '),
      h('div', { class: 'head' }, h('h1', { testid: 'topic-name' }, name), refresh),
      stats,
      h('h2', {}, 'Subscriptions'),
      subs,
      h('h2', {}, 'Peek'),
      h('p', { class: 'muted' }, 'Reads one message by partition and offset. Read-only: it leases nothing.'),
      peekForm,
      peekOut,
      h('h2', {}, 'Produce a test message'),
      produceForm));

    function defaultOffset(partition) {
      const p = topic?.partitions?.find((x) => x.partition === partition);
      if (!p) return '0';
      // The oldest unsettled message if there is one, else the oldest retained.
      return String(p.frontier < p.next_offset ? p.frontier : p.start_offset);
    }

    function step(delta) {
      const current = Number(peekOffset.value);
      const target = Number.isSafeInteger(current) ? current + delta : 0;
      if (target < 0) return;
      peekOffset.value = String(target);
      peek();
    }

    async function peek() {
      const partition = peekPartition.value;
      const offset = peekOffset.value.trim();
      if (partition === '' || !/^\d+$/.test(offset)) {
        peekOut.replaceChildren(h('p', { class: 'note' }, 'Choose a partition and a whole-number offset.'));
        return;
      }
      clearError();
      prev.disabled = offset === '0';
      peekOut.replaceChildren(h('p', { class: 'muted' }, 'Reading…'));
      const q = new URLSearchParams({ partition, offset });
      try {
        const { status, data } = await api(`${topicPath(name)}/consume?${q}`);
        if (!live()) return;
        peekOut.replaceChildren(status === 204
          ? h('p', { class: 'note' }, `Nothing at partition ${partition}, offset ${offset} yet.`)
          : renderMessage(data));
      } catch (err) {
        if (!live()) return;
        if (err.status === 410 || err.code === 'offset_expired') {
          peekOut.replaceChildren(h('p', { class: 'note' },
            `Offset ${offset} of partition ${partition} has expired (removed by retention).`));
        } else {
          peekOut.replaceChildren();
          fail(err);
        }
      }
    }

    // Fetches the topic and redraws settings and partition stats; the forms stay.
    async function load() {
      refresh.disabled = true;
      try {
        const { data } = await api(topicPath(name));
        if (!live()) return;
        const first = topic == null;
        topic = data;
        stats.replaceChildren(renderTopic(data));
        syncPartitions(data, first);
        await loadSubscriptions();
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

    // Every subscription with its figures summed over the partitions (one GET each, a few
    // at a time).
    async function loadSubscriptions() {
      const { data } = await api(`${topicPath(name)}/subscriptions`);
      if (!live()) return;
      const list = data.subscriptions ?? [];
      const full = new Map();
      await pool(list, 4, async (s) => {
        const { data: one } = await api(`${topicPath(name)}/subscriptions/${encodeURIComponent(s.name)}`);
        full.set(s.name, one);
      });
      if (!live()) return;
      subs.replaceChildren(list.length === 0
        ? h('p', { class: 'muted', testid: 'no-subscriptions' },
          'None besides the topic\'s own. Each subscription gets every message, with its own leases and acks.')
        : renderSubscriptions(list.map((s) => full.get(s.name) ?? s)));
    }

    function syncPartitions(data, first) {
      const chosen = peekPartition.value;
      peekPartition.replaceChildren(...(data.partitions ?? []).map((p) =>
        h('option', { value: p.partition }, String(p.partition))));
      if (chosen !== '' && [...peekPartition.options].some((o) => o.value === chosen)) {
        peekPartition.value = chosen;
      }
      if (first) peekOffset.value = defaultOffset(Number(peekPartition.value));
    }

    await load();
  }

  function renderTopic(t) {
    const s = t.settings ?? {};
    const dlt = s.dead_letter_topic;
    const settings = h('dl', { class: 'settings', testid: 'settings' });
    for (const [k, v] of Object.entries(s)) {
      let shown;
      if (k === 'dead_letter_topic') {
        shown = v == null ? 'none' : h('a', { href: topicHref(v), testid: 'dead-letter-link' }, v);
      } else if (k.endsWith('_ms') && typeof v === 'number') {
        shown = `${num(v)} ms (${duration(v)})`;
      } else {
        shown = typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v);
      }
      settings.append(h('div', {}, h('dt', {}, k.replace(/_/g, ' ')), h('dd', {}, shown)));
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
      h('p', { class: 'meta' },
        `Created ${t.created_at ?? '—'}`,
        dlt ? [' · ', h('a', { href: topicHref(dlt), testid: 'dead-letter-topic' }, 'dead-letter topic'), ` (${dlt})`] : null),
      h('h2', {}, 'Partitions'),
      h('div', { class: 'scroll' }, table),
      h('h2', {}, 'Settings'),
      settings);
  }

  function renderSubscriptions(list) {
    const numCell = (v, testid) => h('td', { class: 'num', testid }, num(v));
    const oldest = (parts, field) => parts.reduce((m, p) =>
      (typeof p[field] === 'number' && (m == null || p[field] > m) ? p[field] : m), null);
    return h('div', { class: 'scroll' }, h('table', { id: 'subscriptions-table', testid: 'subscriptions-table' },
      h('thead', {}, h('tr', {},
        ...['Subscription', 'Start', 'Backlog', 'In flight', 'Acked ahead', 'Delayed', 'Lost',
          'Oldest message age', 'Visibility timeout', 'Paused']
          .map((label) => h('th', { class: ['Subscription', 'Start', 'Oldest message age', 'Paused'].includes(label) ? '' : 'num' }, label)))),
      h('tbody', {}, list.map((s) => {
        const parts = s.partitions ?? [];
        const e = s.effective ?? {};
        return h('tr', { testid: 'subscription-row', 'data-subscription': s.name },
          h('td', { testid: 'subscription-name' }, s.name),
          h('td', {}, s.start ?? '—'),
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
    const field = (label, value, testid) => h('div', {}, h('dt', {}, label), h('dd', { testid }, value));
    return h('article', { class: 'message' },
      h('dl', { class: 'fields' },
        field('Partition', num(m.partition), 'peek-partition-value'),
        field('Offset', num(m.offset), 'peek-offset-value'),
        field('Key', m.key ?? '(none)', 'peek-key'),
        field('Produced at', m.produced_at ?? '—', 'peek-produced-at'),
        field('Delivery count', num(m.delivery_count), 'peek-delivery-count'),
        field('Payload', kind, 'peek-kind')),
      h('pre', { class: 'payload', testid: 'peek-payload' }, text));
  }

  // ---- Routing -----------------------------------------------------------------------

  function route() {
    clearError();
    generation += 1;
    const mine = generation;
    const live = () => mine === generation;
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
    (name != null ? showTopic(name, live) : showTopics(live)).catch((err) => live() && fail(err));
  }

  window.addEventListener('hashchange', route);
  route();
})();
