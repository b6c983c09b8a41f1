// The trainstate page: the list of runs and one run's view, kept live by the
// head's event stream (GET /api/train/events), with polling as the fallback.
// Plain JavaScript, no build step. Text from runs is only ever inserted as
// text (text nodes, textContent, attribute values), never as HTML.
'use strict';

(() => {
  // Paths, statuses, event kinds, error statuses and limits come from the
  // head's contract (contract.js, generated from its route table).
  /** The statuses the listing's filter tells apart, as V1 readers see runs. */
  const STATUSES = CONTRACT.v1RunStatuses;
  const EVENT_KINDS = CONTRACT.eventKinds;
  const RUN_PAGE = Math.min(100, CONTRACT.limits.LIST_LIMIT_MAX);
  const UNAUTHORIZED = CONTRACT.errorStatus.unauthorized;
  const NOT_FOUND = CONTRACT.errorStatus.not_found;
  const NODE_PAGE = 50;
  const WORKER_PAGE = 200;
  const POLL_MS = 5000;
  const SSE_RETRY_MS = 15000;
  const MIN_REFRESH_MS = 1000;
  const TOKEN_KEY = 'trainstate.token';
  const CAUSES = {
    USER_ERROR: 'User error',
    SYSTEM_ERROR: 'System error',
    LOST_CONTROLLER: 'Lost controller',
    USER_INTERRUPT: 'User interrupt',
    OOM: 'Out of memory',
    PREEMPTED: 'Preempted',
    TIMEOUT: 'Time limit',
    NODE_LOST: 'Node lost',
    HARDWARE: 'Hardware fault',
  };
  /** Whose fault a cause was, in words (`docs/causes.md`). */
  const CLASSES = {
    INFRASTRUCTURE: "the machine's fault",
    APPLICATION: "the code's fault",
    INTERRUPTED: 'stopped on purpose',
    NO_PROGRESS: 'had stopped making progress',
  };
  /** Cause `cause`'s class, as a badge titled in words, or null. */
  const classBadge = (cause) => (cause.class
    ? h('span', { class: `cause-class class-${cause.class.toLowerCase()}`, title: CLASSES[cause.class] || '' }, cause.class)
    : null);
  /** A run the rendezvous assembled has ranks, not a controller: its own words. */
  const RENDEZVOUS_PREFIX = 'rendezvous:';
  const RANK_CAUSES = { LOST_CONTROLLER: 'No rank heard from' };
  const ofRendezvous = (run) => String(run.controller_actor_id || '').startsWith(RENDEZVOUS_PREFIX);
  /** The label of cause `kind` on `run`, or null. */
  const causeLabel = (run, kind) => (ofRendezvous(run) && RANK_CAUSES[kind]) || CAUSES[kind] || null;

  const app = document.getElementById('app');
  const banner = document.getElementById('banner');
  const connection = document.getElementById('connection');

  // ---- Text: control characters are shown escaped, as `\u{1b}` ----------

  // ---- Paths: the route table's templates ------------------------------

  /** The path of the route `operation` (its operationId), each `{name}` filled with `params[name]`. */
  function pathOf(operation, params = {}) {
    return CONTRACT.routes[operation].path.replace(
      /\{(\w+)\}/g, (_, name) => encodeURIComponent(String(params[name])));
  }
  /** The parameters of `pathname` when it fits the route's template (a trailing `/` allowed), else null. */
  function matchPath(operation, pathname) {
    const want = CONTRACT.routes[operation].path.split('/');
    const have = pathname.replace(/(.)\/$/, '$1').split('/');
    if (want.length !== have.length) return null;
    const params = {};
    for (let i = 0; i < want.length; i++) {
      const name = /^\{(\w+)\}$/.exec(want[i]);
      if (name && have[i]) params[name[1]] = decodeURIComponent(have[i]);
      else if (want[i] !== have[i]) return null;
    }
    return params;
  }

  const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;
  const CONTROL_BUT_LINES = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;
  const escapeChar = (c) => '\\u{' + c.charCodeAt(0).toString(16) + '}';
  /** One line of text: every control character escaped. */
  const line = (s) => String(s ?? '').replace(CONTROL, escapeChar);
  /** A block of text: newlines and tabs kept, other control characters escaped. */
  const block = (s) => String(s ?? '').replace(CONTROL_BUT_LINES, escapeChar);

  /** An element; strings among `kids` become text nodes. */
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key === 'style') Object.assign(el.style, value);
      else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? '' : line(value));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : line(kid));
    }
    return el;
  }

  /** Replaces `el`'s children, skipping the empty ones. */
  const fill = (el, ...kids) => el.replaceChildren(
    ...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false));

  const pad = (n) => String(n).padStart(2, '0');
  const num = (n) => Number(n).toLocaleString();
  const plural = (n, word) => `${num(n)} ${word}${n === 1 ? '' : 's'}`;
  /** A long id as its first and last characters; the whole id goes in a title. */
  const short = (id) => (id.length > 16 ? `${id.slice(0, 6)}…${id.slice(-6)}` : id);
  /** A node as people name it: `hostname (id…)`, or its id alone when its host name is unknown. */
  const nodeText = (name, id) => (name ? `${name} (${short(id)})` : short(id));
  /** True once a run has ended. */
  const ended = (run) => run.end_time_ms !== null && run.end_time_ms !== undefined;
  const gpuCount = (workers) => workers.reduce((n, w) => n + w.gpu_ids.length, 0);

  /**
   * A time as a Date, or null when it is absent or not a valid date (a time
   * in nanoseconds is past the largest Date): such a time shows as "—"
   * rather than failing the whole page (`RangeError: Invalid time value`).
   */
  function dateOf(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(Number(ms))) return null;
    const d = new Date(Number(ms));
    return Number.isNaN(d.getTime()) ? null : d;
  }

  function formatTime(ms) {
    const d = dateOf(ms);
    if (d === null) return '—';
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function formatDuration(ms) {
    if (!Number.isFinite(ms)) return '—';
    let s = Math.max(0, Math.floor(ms / 1000));
    const d = Math.floor(s / 86400);
    s -= d * 86400;
    const hours = Math.floor(s / 3600);
    s -= hours * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    if (d) return `${d}d ${hours}h`;
    if (hours) return `${hours}h ${pad(m)}m`;
    if (m) return `${m}m ${pad(s)}s`;
    return `${s}s`;
  }

  function timeEl(ms) {
    const d = dateOf(ms);
    if (d === null) return h('span', { class: 'muted' }, '—');
    const iso = d.toISOString();
    return h('time', { datetime: iso, title: iso }, formatTime(ms));
  }

  /** A run's duration; a live run's ticks every second. */
  function durationEl(start, end) {
    if (end === null || end === undefined) {
      return h('span', { 'data-live-since': start }, formatDuration(Date.now() - start));
    }
    return h('span', null, formatDuration(end - start));
  }

  setInterval(() => {
    for (const el of document.querySelectorAll('[data-live-since]')) {
      el.textContent = formatDuration(Date.now() - Number(el.dataset.liveSince));
    }
  }, 1000);

  const badge = (status) => h('span', { class: `badge s-${String(status).toLowerCase()}` }, status);
  /** A run's stall capture as one string (its id and state), to tell when it moved. */
  const captureKey = (run) => (run && run.health && run.health.capture
    ? `${run.health.capture.capture_id}:${run.health.capture.state}` : '');
  /** True for a live run whose health is STALLED (not a stall its run ended in). */
  const liveStall = (run) => Boolean(run.health && run.health.state === 'STALLED' && !run.end_time_ms
    && (run.health.ended_ms === null || run.health.ended_ms === undefined));
  /**
   * A live run that stopped making progress: its STALLED badge; a run that
   * ended while stalled: a quiet "ended while stalled" badge (nobody needs
   * to look at it now); null otherwise.
   */
  const stalledBadge = (run) => {
    if (liveStall(run)) {
      return h('span', { class: 'badge h-stalled', 'data-health': 'STALLED', title: run.health.detail || null }, 'STALLED');
    }
    if (run.health && Number.isFinite(run.health.ended_ms)) {
      return h('span', { class: 'badge h-ended', 'data-health': 'ENDED_STALLED', title: run.health.detail || null }, 'ended while stalled');
    }
    return null;
  };

  /**
   * A run's progress from its ranks' reports: the highest step, the
   * largest total, and an ETA at the run's average pace since it started
   * (null without a step).
   */
  function progressOf(run) {
    const ranks = Array.isArray(run.rank_progress) ? run.rank_progress.filter((p) => p && Number.isFinite(p.step)) : [];
    if (!ranks.length) return null;
    const step = Math.max(...ranks.map((p) => p.step));
    const totals = ranks.map((p) => p.total_steps).filter((t) => Number.isFinite(t) && t > 0);
    const total = totals.length ? Math.max(...totals) : null;
    const live = run.end_time_ms === null || run.end_time_ms === undefined;
    const elapsed = Date.now() - run.start_time_ms;
    // A stalled run has no pace to estimate from: how long it stood still instead.
    const stalled = liveStall(run);
    const eta = live && !stalled && total && step > 0 && step < total && elapsed > 0 ? (elapsed / step) * (total - step) : null;
    const lastAdvance = Number.isFinite(run.health && run.health.last_advance_ms) ? run.health.last_advance_ms
      : Math.max(...ranks.map((p) => (Number.isFinite(p.last_advance_ms) ? p.last_advance_ms : 0)));
    const stalledSince = stalled && lastAdvance > 0 ? lastAdvance : null;
    return { step, total, eta, stalledSince, ranks };
  }
  // ---- Goodput: where a run's (or a group's) time went, by bucket ---------

  /** The buckets, productive first, in the order the bar draws them (`GoodputBucket::ALL`). */
  const GOODPUT_BUCKETS = [
    ['productive', 'Productive'],
    ['waiting_to_start', 'Waiting to start'],
    ['restarting', 'Restarting'],
    ['stalled', 'Stalled'],
    ['checkpointing', 'Checkpointing'],
    ['progress_lost', 'Progress lost'],
    ['slower_than_pace', 'Slower than pace'],
  ];
  /** A share between 0 and 1 as a percentage: `53.8 %`. */
  const percent = (share) => (Number.isFinite(share) ? `${(100 * share).toFixed(1)} %` : '—');
  /**
   * The ms of each bucket of `productive` and `badput` (a run's goodput, or
   * a group's GPU-ms), with its share of `wall`: [bucket, label, ms, share].
   */
  function goodputParts(wall, productive, badput) {
    return GOODPUT_BUCKETS.map(([bucket, label]) => {
      const ms = bucket === 'productive' ? Number(productive) : Number((badput || {})[`${bucket}_ms`]);
      const value = Number.isFinite(ms) && ms > 0 ? ms : 0;
      return [bucket, label, value, wall > 0 ? value / wall : 0];
    });
  }
  /** One horizontal bar split by bucket; each part's width is its share, its title its words. */
  function goodputBar(parts, label, describe) {
    return h('div', { class: 'goodput-bar', role: 'img', 'aria-label': label },
      parts.filter((p) => p[2] > 0).map(([bucket, name, ms, share]) => h('span', {
        class: `gp gp-${bucket}`, 'data-bucket': bucket, 'data-share': share.toFixed(4),
        style: { width: `${(100 * share).toFixed(3)}%` }, title: `${name}: ${describe(ms)} (${percent(share)})`,
      })));
  }
  /** The legend of a bar: each bucket that counted something, its colour, amount and share. */
  function goodputLegend(parts, describe) {
    return h('ul', { class: 'goodput-legend' },
      parts.filter((p) => p[2] > 0).map(([bucket, name, ms, share]) => h('li', { 'data-bucket': bucket },
        h('span', { class: `swatch gp-${bucket}`, 'aria-hidden': 'true' }), `${name} `,
        h('span', { class: 'gp-amount' }, describe(ms)), ' ', h('span', { class: 'muted gp-share' }, `(${percent(share)})`))));
  }

  /** A run's lifecycle status: Ray Train V2's sub-status when it has one. */
  const statusOf = (run) => run.status || run.run_status;

  // ---- Links out: the operator's URL templates (GET /api/links) ---------

  const WORKER_PLACEHOLDERS = CONTRACT.workerLinkPlaceholders;
  let links = null;
  let linksLoading = null;
  /** Loads the templates once; a head without them shows no links. */
  function loadLinks() {
    linksLoading ??= (async () => {
      try { links = await api(pathOf('getLinks')); } catch (_) { links = null; }
    })();
    return linksLoading;
  }
  const perWorker = (template) => WORKER_PLACEHOLDERS.some((p) => template.includes(`{${p}}`));
  /** `template` filled for `run` and, for a per-worker template, `worker`. */
  function fillLink(template, run, worker) {
    const attempts = run.attempts || [];
    const values = {
      run_id: run.id, run_name: run.name, job_id: run.job_id,
      attempt_id: attempts.length ? attempts[attempts.length - 1].attempt_id : '',
      start_ms: run.start_time_ms, end_ms: run.end_time_ms ?? '',
      rank: worker ? worker.world_rank : '', node_id: worker ? worker.node_id : '',
      node_ip: worker ? worker.node_ip : '', pid: worker ? worker.pid : '',
    };
    return template.replace(/\{(\w+)\}/g, (_, name) => encodeURIComponent(String(values[name] ?? '')));
  }
  /** The configured links of a run (`worker` null) or of a worker. */
  function linksOf(run, worker) {
    if (!links) return [];
    return [['logs', 'Logs'], ['metrics', 'Metrics']]
      .filter(([key]) => links[key] && perWorker(links[key]) === Boolean(worker))
      .map(([key, label]) => h('a', {
        href: fillLink(links[key], run, worker), target: '_blank', rel: 'noopener noreferrer',
        class: 'out', 'data-link': key,
      }, label));
  }
  /** How many attempts the run's settings allow (max_failures + 1), if they say. */
  function attemptBudget(run) {
    const failures = run.run_settings?.run_config?.failure_config?.max_failures;
    return Number.isInteger(failures) && failures >= 0 ? failures + 1 : null;
  }

  function copyButton(text, what) {
    const button = h('button', {
      type: 'button', class: 'copy', title: `Copy the ${what}`, 'aria-label': `Copy the ${what}`,
    }, 'copy');
    button.addEventListener('click', async (event) => {
      event.stopPropagation();
      let ok = false;
      try {
        await navigator.clipboard.writeText(text);
        ok = true;
      } catch (_) {
        // Not a secure context: fall back to a selection.
        const area = h('textarea', { class: 'offscreen', 'aria-hidden': 'true' });
        area.value = text;
        document.body.append(area);
        area.select();
        try { ok = document.execCommand('copy'); } catch (_) { ok = false; }
        area.remove();
      }
      button.textContent = ok ? 'copied' : 'failed';
      setTimeout(() => { button.textContent = 'copy'; }, 1200);
    });
    return button;
  }

  function section(title, ...content) {
    const id = 'h-' + title.toLowerCase().replace(/[^a-z0-9]+/g, '-');
    return h('section', { class: 'panel', 'aria-labelledby': id }, h('h2', { id }, title), content);
  }

  /** A table of `columns` ([label, className]) with `rows`. */
  function table(label, columns, rows, props) {
    return h('div', { class: 'table-wrap' },
      h('table', Object.assign({ 'aria-label': label }, props),
        h('thead', null, h('tr', null, columns.map((col) =>
          col instanceof Node ? col : h('th', { scope: 'col', class: col[1] }, col[0])))),
        h('tbody', null, rows)));
  }

  /** Prev/next buttons and the range shown; `key` keeps focus across renders. */
  function pager(key, label, { from, to, total, prev, next, first, last }) {
    const button = (name, text, action) => h('button', {
      type: 'button', 'data-key': `${key}-${name}`, disabled: !action, onclick: action,
    }, text);
    return h('nav', { class: 'pager', 'aria-label': label },
      first !== undefined ? button('first', '« First', first) : null,
      button('prev', '‹ Prev', prev),
      h('span', { class: 'range' }, total ? `${num(from)}–${num(to)} of ${num(total)}` : 'none'),
      button('next', 'Next ›', next),
      last !== undefined ? button('last', 'Last »', last) : null);
  }

  /** Renders, then gives focus back to the element that had it (by `data-key`). */
  function keepFocus(render) {
    const active = document.activeElement;
    const key = active && active.dataset ? active.dataset.key : undefined;
    render();
    if (key && document.activeElement !== active) {
      const again = document.querySelector(`[data-key="${CSS.escape(key)}"]`);
      if (again) again.focus({ preventScroll: true });
    }
  }

  /** Calls `fn` at most once per `gap` ms, and always once after the last call. */
  function throttle(fn, gap) {
    let timer = null;
    let last = -Infinity;
    return () => {
      if (timer) return;
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, Math.max(0, last + gap - Date.now()));
    };
  }

  // ---- The API, with the read token when the head protects reads ---------

  function readToken() {
    const url = new URL(location.href);
    const given = url.searchParams.get('token');
    let stored = '';
    try {
      if (given) sessionStorage.setItem(TOKEN_KEY, given);
      stored = sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (_) {
      // Storage disabled: the token lives as long as the page.
    }
    if (given !== null) {
      // Keep the token out of the address bar and the history.
      url.searchParams.delete('token');
      history.replaceState(null, '', url.pathname + url.search + url.hash);
    }
    return given || stored;
  }
  const token = readToken();

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path) {
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    let response;
    try {
      response = await fetch(path, { headers, cache: 'no-store' });
    } catch (_) {
      throw new ApiError(0, 'Cannot reach the head.');
    }
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
    if (!response.ok) {
      if (response.status === UNAUTHORIZED) askForToken();
      const message = body && body.error ? body.error.message : `HTTP ${response.status}`;
      throw new ApiError(response.status, message);
    }
    return body;
  }

  let tokenAsked = false;
  function showBanner(...content) {
    if (tokenAsked) return;
    banner.replaceChildren(...content);
    banner.hidden = false;
  }
  function hideBanner() {
    if (tokenAsked) return;
    banner.hidden = true;
    banner.replaceChildren();
  }
  function askForToken() {
    if (tokenAsked) return;
    const input = h('input', { type: 'password', id: 'token-input', autocomplete: 'off', required: true });
    const form = h('form', { class: 'token-form' },
      h('label', { for: 'token-input' },
        token ? 'The head refused the token. Token:' : 'This head needs a token to read. Token:'),
      input, h('button', { type: 'submit' }, 'Use token'));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const url = new URL(location.href);
      url.searchParams.set('token', input.value.trim());
      location.assign(url.href);
    });
    showBanner(form);
    tokenAsked = true;
  }

  // ---- Live updates: SSE, polling while it is down or unavailable --------

  let source = null;
  let pollTimer = null;

  function setConnection(state, text) {
    connection.dataset.state = state;
    connection.textContent = text;
  }
  function startPolling() {
    if (!pollTimer) pollTimer = setInterval(refresh, POLL_MS);
  }
  function stopPolling() {
    clearInterval(pollTimer);
    pollTimer = null;
  }

  function connect() {
    if (typeof EventSource !== 'function') {
      setConnection('polling', 'polling every 5 s');
      startPolling();
      return;
    }
    const query = token ? `?access_token=${encodeURIComponent(token)}` : '';
    const es = new EventSource(`${pathOf('runEvents')}${query}`);
    source = es;
    let lost = false;
    es.onopen = () => {
      setConnection('live', 'live');
      hideBanner();
      stopPolling();
      // Back after an outage: catch up now (a first connection gets its snapshot).
      if (lost) refresh();
      lost = false;
    };
    es.onerror = (event) => {
      if (source !== es) return;
      if (event instanceof MessageEvent) {
        // The head's own `error` event: it could not build a snapshot.
        showBanner(`The head could not send its runs: ${line(event.data)}`);
        refresh();
        return;
      }
      lost = true;
      startPolling();
      if (es.readyState === EventSource.CLOSED) {
        // Refused (no token, too many subscribers, ...): EventSource gives up, so retry later.
        es.close();
        source = null;
        setConnection('polling', 'polling every 5 s');
        showBanner('No live connection to the head; polling every 5 s.');
        setTimeout(connect, SSE_RETRY_MS);
      } else {
        setConnection('reconnecting', 'reconnecting…');
        showBanner('Lost the live connection to the head. Reconnecting…');
      }
    };
    es.addEventListener('snapshot', refresh);
    for (const kind of EVENT_KINDS) {
      es.addEventListener(kind, (message) => {
        let event;
        try { event = JSON.parse(message.data); } catch (_) { return; }
        if (view) view.onEvent(event);
      });
    }
  }

  // ---- Routing: the page (`page`) lists runs, `runPage` shows one --------

  let view = null;

  function route() {
    if (view) view.close();
    const match = matchPath('runPage', location.pathname);
    if (match) view = runView(match.id);
    else if (matchPath('nodesPage', location.pathname)) view = nodesView();
    else if (matchPath('goodputPage', location.pathname)) view = goodputView();
    else view = runsView();
  }
  function refresh() {
    if (view) view.refresh();
  }
  function navigate(href) {
    history.pushState(null, '', href);
    route();
    window.scrollTo(0, 0);
    app.focus({ preventScroll: true });
  }

  document.addEventListener('click', (event) => {
    const link = event.target.closest('a[data-nav]');
    if (!link || event.defaultPrevented || event.button !== 0 ||
        event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    navigate(link.getAttribute('href'));
  });
  window.addEventListener('popstate', route);

  const runHref = (id) => pathOf('runPage', { id });
  const errorNote = (err) => h('p', { class: 'error', role: 'alert' }, `Could not load: ${err.message}`);

  // ---- The nodes view: the node ledger, suspects first ---------------------

  function nodesView() {
    const params = new URLSearchParams(location.search);
    const chosen = params.get('node');
    const st = { closed: false, seq: 0 };
    document.title = 'Nodes · trainstate';
    const body = h('div', { id: 'nodes' }, h('p', { class: 'muted' }, 'Loading…'));
    fill(app,
      h('nav', { class: 'crumbs' }, h('a', { href: '/', 'data-nav': true }, 'Runs'), ' · ',
        h('a', { href: pathOf('nodesPage', {}), 'data-nav': true }, 'Nodes')),
      h('h1', {}, chosen ? `Node ${line(chosen)}` : 'Nodes'),
      body);
    const runLinks = (ids) => ids.map((id, i) => [i ? ' ' : '',
      h('a', { href: runHref(id), 'data-nav': true, title: id }, short(id))]);
    const nodeHref = (name) => `${pathOf('nodesPage', {})}?node=${encodeURIComponent(name)}`;
    function table(nodes) {
      const head = ['Node', 'Cluster', 'Verdict', 'Attempts', 'Infrastructure', 'Application',
        'Interrupted', 'No progress', 'Stall suspect', 'Straggler', 'Last seen'];
      return h('table', { class: 'runs nodes' },
        h('thead', {}, h('tr', {}, head.map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, nodes.map((n) => h('tr', { class: n.suspect ? 'suspect' : null, 'data-node': n.node },
          h('td', {}, h('a', { href: nodeHref(n.node), 'data-nav': true }, n.node)),
          h('td', {}, n.cluster || '—'),
          h('td', { title: n.reason || '' }, n.suspect ? 'SUSPECT' : 'ok'),
          h('td', {}, num(n.attempts)),
          h('td', {}, num(n.failures.infrastructure)),
          h('td', {}, num(n.failures.application)),
          h('td', {}, num(n.failures.interrupted)),
          h('td', {}, num(n.failures.no_progress)),
          h('td', {}, num(n.stall_suspect)),
          h('td', {}, num(n.straggler)),
          h('td', {}, n.last_seen_ms ? new Date(n.last_seen_ms).toISOString() : '—')))));
    }
    async function load() {
      const seq = ++st.seq;
      try {
        if (chosen) {
          const detail = await api(pathOf('getNode', { node: chosen }));
          if (st.closed || seq !== st.seq) return;
          fill(body, detail.nodes.map((n) => [
            table([n]),
            n.reason ? h('p', { class: 'error' }, `Suspect: ${n.reason}`) : null,
            h('dl', { class: 'node-runs' },
              h('dt', {}, 'Failures'), h('dd', {}, runLinks(n.runs.failures.map((f) => f.run_id))),
              h('dt', {}, 'Attempts'), h('dd', {}, runLinks(n.runs.attempts)),
              h('dt', {}, 'Stall suspect'), h('dd', {}, runLinks(n.runs.stall_suspect)),
              h('dt', {}, 'Straggler'), h('dd', {}, runLinks(n.runs.straggler))),
          ]));
        } else {
          const listed = await api(pathOf('listNodes', {}));
          if (st.closed || seq !== st.seq) return;
          fill(body,
            listed.beyond_retention && listed.retained_since_ms
              ? h('p', { class: 'note' }, `Counted from ${new Date(listed.retained_since_ms).toISOString()}: the head retains nothing older.`)
              : null,
            h('p', { class: 'muted' }, listed.rule),
            listed.nodes.length ? table(listed.nodes) : h('p', { class: 'muted' }, 'No nodes in the window.'));
        }
      } catch (err) {
        if (!st.closed) fill(body, errorNote(err));
      }
    }
    load();
    const soon = throttle(load, MIN_REFRESH_MS);
    return { refresh: soon, onEvent: soon, close: () => { st.closed = true; } };
  }

  // ---- The fleet's goodput: every retained run's time, by group ----------

  const GOODPUT_BY = ['cluster', 'node', 'name'];
  const GOODPUT_WINDOWS = [['24h', '24 h', 24 * 3600000], ['7d', '7 d', 7 * 24 * 3600000], ['30d', '30 d', 30 * 24 * 3600000]];
  const UNAVAILABLE = CONTRACT.errorStatus.unavailable;
  /** GPU-ms as GPU-hours: `12.5 GPU-h`. */
  const gpuHours = (ms) => `${(Number(ms) / 3600000).toFixed(ms >= 36000000 ? 0 : 1)} GPU-h`;

  function goodputView() {
    const params = new URLSearchParams(location.search);
    const st = {
      by: GOODPUT_BY.includes(params.get('by')) ? params.get('by') : 'cluster',
      window: GOODPUT_WINDOWS.some((w) => w[0] === params.get('window')) ? params.get('window') : '7d',
      closed: false, seq: 0,
    };
    document.title = 'Goodput · trainstate';
    const select = (id, label, options, value, onchange) => h('label', { class: 'search' }, `${label} `,
      h('select', { id, onchange: (event) => onchange(event.target.value) },
        options.map(([key, text]) => h('option', { value: key, selected: key === value }, text))));
    const body = h('div', { id: 'goodput-fleet' }, h('p', { class: 'muted' }, 'Loading…'));
    fill(app,
      h('nav', { class: 'crumbs' }, h('a', { href: '/', 'data-nav': true }, 'Runs'), ' · ',
        h('a', { href: pathOf('goodputPage', {}), 'data-nav': true }, 'Goodput')),
      h('div', { class: 'toolbar' },
        h('h1', {}, 'Goodput'),
        select('goodput-by', 'By', GOODPUT_BY.map((b) => [b, b]), st.by, (by) => { st.by = by; restart(); }),
        select('goodput-window', 'Over the last', GOODPUT_WINDOWS.map(([key, text]) => [key, text]), st.window,
          (window) => { st.window = window; restart(); })),
      h('p', { class: 'muted' }, 'Each run weighs by its GPUs (its workers when it has none): the figures are GPU-hours, the ratio the share of them that went into kept progress.'),
      body);

    function restart() {
      history.replaceState(null, '', `${pathOf('goodputPage', {})}?by=${st.by}&window=${st.window}`);
      load();
    }
    const describe = gpuHours;
    function row(key, cluster, totals, cls) {
      const wall = Number(totals.wall_gpu_ms) || 0;
      const parts = goodputParts(wall, totals.productive_gpu_ms, totals.badput_gpu_ms);
      return h('tr', { class: cls, 'data-group': key === null ? '' : key },
        h('td', { class: 'name' }, key === null ? h('span', { class: 'muted' }, cls ? 'All runs' : 'no cluster') : key),
        st.by === 'cluster' ? null : h('td', {}, cluster || h('span', { class: 'muted' }, '—')),
        h('td', { class: 'num' }, num(totals.runs)),
        h('td', { class: 'num' }, num(totals.live)),
        h('td', { class: 'num' }, describe(wall)),
        h('td', { class: 'num gp-ratio' }, percent(totals.ratio)),
        h('td', { class: 'gp-cell' }, goodputBar(parts, `Goodput ${percent(totals.ratio)}`, describe)));
    }
    async function load() {
      const seq = ++st.seq;
      const span = GOODPUT_WINDOWS.find((w) => w[0] === st.window)[2];
      const query = new URLSearchParams({ by: st.by, since: String(Date.now() - span) });
      try {
        const answer = await api(`${pathOf('getGoodput', {})}?${query}`);
        if (st.closed || seq !== st.seq) return;
        const groups = Array.isArray(answer.groups) ? answer.groups : [];
        const head = ['Group', st.by === 'cluster' ? null : 'Cluster', 'Runs', 'Live', 'GPU time', 'Goodput', 'Where the time went']
          .filter((c) => c !== null);
        const totalParts = goodputParts(Number(answer.total.wall_gpu_ms) || 0, answer.total.productive_gpu_ms, answer.total.badput_gpu_ms);
        fill(body,
          answer.beyond_retention ? h('p', { class: 'note', id: 'goodput-retention' },
            answer.retained_since_ms
              ? ['The window starts before the oldest retained run (', timeEl(answer.retained_since_ms), '): these figures are of what the head retains, not of the whole window.']
              : 'The window starts before anything the head retains: these figures are of what it retains, not of the whole window.') : null,
          groups.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'runs goodput-groups', id: 'goodput-groups' },
            h('thead', {}, h('tr', {}, head.map((c) => h('th', { scope: 'col' }, c)))),
            h('tbody', {}, groups.map((g) => row(g.key ?? null, g.cluster, g, null))),
            h('tfoot', {}, row(null, null, answer.total, 'total'))))
            : h('p', { class: 'muted' }, 'No runs in the window.'),
          groups.length ? goodputLegend(totalParts, describe) : null);
      } catch (err) {
        if (st.closed || seq !== st.seq) return;
        fill(body, h('p', { class: 'error', role: 'alert', id: 'goodput-error' },
          err.status === UNAVAILABLE
            ? `The head cannot count the fleet's goodput right now (HTTP ${err.status}): ${err.message}`
            : `Could not load the fleet's goodput: ${err.message}`));
      }
    }
    load();
    const soon = throttle(load, MIN_REFRESH_MS);
    return { refresh: soon, onEvent: soon, close: () => { st.closed = true; } };
  }

  // ---- The runs view -----------------------------------------------------

  function runsView() {
    const params = new URLSearchParams(location.search);
    const st = {
      status: STATUSES.includes(params.get('status')) ? params.get('status') : '',
      name: params.get('name') || '',
      cluster: params.get('cluster') || '',
      cursors: [null],
      page: null,
      counts: null,
      error: null,
      seq: 0,
      closed: false,
    };
    document.title = 'Runs · trainstate';

    const counts = h('div', { class: 'counts', role: 'group', 'aria-label': 'Runs by status' });
    const search = h('input', {
      type: 'search', id: 'run-filter', placeholder: 'Filter by name', value: st.name,
      autocomplete: 'off', spellcheck: 'false',
    });
    const clusterInput = h('input', {
      type: 'search', id: 'cluster-filter', placeholder: 'Cluster', value: st.cluster,
      autocomplete: 'off', spellcheck: 'false',
    });
    const note = h('div', { class: 'note' });
    const body = h('tbody');
    const pagerSlot = h('div');
    const columns = [
      ['Name'], ['ID', 'opt'], ['Status'], ['Job', 'opt'], ['Started', 'opt'], ['Duration', 'num'],
      ['Workers', 'num'], ['GPUs', 'num'], ['Goodput', 'num opt'], ['Datasets', 'opt'], ['Cluster', 'opt'],
    ];
    fill(app,
      h('div', { class: 'toolbar' },
        h('h1', null, 'Runs'),
        h('label', { class: 'search' }, h('span', { class: 'sr-only' }, 'Filter runs by name'), search),
        h('label', { class: 'search cluster' }, h('span', { class: 'sr-only' }, 'Only runs of this cluster'), clusterInput)),
      counts, note,
      h('div', { class: 'table-wrap' },
        h('table', { id: 'runs', class: 'runs' },
          h('caption', { class: 'sr-only' }, 'Training runs, newest first'),
          h('thead', null, h('tr', null,
            columns.map(([label, cls]) => h('th', { scope: 'col', class: cls }, label)))),
          body)),
      pagerSlot);

    let typing = null;
    search.addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        st.name = search.value;
        restart();
      }, 250);
    });
    clusterInput.addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        st.cluster = clusterInput.value.trim();
        restart();
      }, 250);
    });
    // A click anywhere on a row opens it; keyboard users have the name link.
    body.addEventListener('click', (event) => {
      const row = event.target.closest('tr[data-run-id]');
      if (!row || event.target.closest('a, button') || String(getSelection())) return;
      navigate(runHref(row.dataset.runId));
    });

    function restart() {
      if (st.closed) return;
      st.cursors = [null];
      const query = new URLSearchParams();
      if (st.status) query.set('status', st.status);
      if (st.name) query.set('name', st.name);
      if (st.cluster) query.set('cluster', st.cluster);
      history.replaceState(null, '', query.toString() ? `${pathOf('page')}?${query}` : pathOf('page'));
      load();
    }

    async function load() {
      if (st.closed) return;
      const seq = ++st.seq;
      const url = (extra) => {
        const query = new URLSearchParams(extra);
        if (st.name) query.set('name', st.name);
        if (st.cluster) query.set('cluster', st.cluster);
        return `${pathOf('listRuns')}?${query}`;
      };
      const pageQuery = { limit: RUN_PAGE };
      if (st.status) pageQuery.status = st.status;
      const cursor = st.cursors[st.cursors.length - 1];
      if (cursor) pageQuery.cursor = cursor;
      try {
        const [page, ...totals] = await Promise.all([
          api(url(pageQuery)),
          ...STATUSES.map((status) => api(url({ status, limit: 1 }))),
        ]);
        if (seq !== st.seq || st.closed) return;
        if (page.train_runs.length === 0 && st.cursors.length > 1) {
          // The runs of this page are gone: step back.
          st.cursors.pop();
          load();
          return;
        }
        st.page = page;
        st.counts = totals.map((t) => t.total);
        st.error = null;
      } catch (err) {
        if (seq !== st.seq || st.closed) return;
        st.error = err;
      }
      keepFocus(render);
    }

    function render() {
      fill(note, st.error ? errorNote(st.error) : null);
      if (st.counts) {
        const all = st.counts.reduce((a, b) => a + b, 0);
        const chip = (status, label, count) => h('button', {
          type: 'button', class: `chip ${status ? `s-${status.toLowerCase()}` : 'all'}`,
          'data-status': status || 'ALL', 'data-key': `chip-${status}`, 'aria-pressed': String(st.status === status),
          onclick: () => {
            st.status = st.status === status ? '' : status;
            restart();
          },
        }, h('span', { class: 'chip-label' }, label), h('span', { class: 'count' }, num(count)));
        fill(counts, chip('', 'All', all),
          ...STATUSES.map((status, i) => chip(status, status, st.counts[i])));
      }
      if (!st.page) return;
      const runs = st.page.train_runs;
      fill(body, runs.map(runRow));
      if (!runs.length) {
        const text = st.status || st.name || st.cluster ? 'No runs match the filter.'
          : 'No runs yet. Runs appear here as soon as a trainer reports them.';
        body.append(h('tr', null, h('td', { colspan: columns.length, class: 'empty' }, text)));
      }
      const from = (st.cursors.length - 1) * RUN_PAGE + 1;
      fill(pagerSlot, pager('runs', 'Pages of runs', {
        from, to: from + runs.length - 1, total: st.page.total,
        prev: st.cursors.length > 1 ? () => { st.cursors.pop(); load(); } : null,
        next: st.page.next_cursor ? () => { st.cursors.push(st.page.next_cursor); load(); } : null,
      }));
    }

    function runRow(run) {
      const datasets = run.datasets.map((d) => d.name).join(', ');
      return h('tr', { 'data-run-id': run.id, 'data-status': statusOf(run) },
        h('td', { 'data-col': 'name', class: 'name' },
          h('a', { href: runHref(run.id), 'data-nav': true, 'data-key': `run-${run.id}` }, run.name)),
        h('td', { 'data-col': 'id', class: 'mono nowrap opt' },
          h('span', { title: run.id }, short(run.id)), ' ', copyButton(run.id, 'run id')),
        h('td', { 'data-col': 'status' }, badge(statusOf(run)), stalledBadge(run) ? ' ' : null, stalledBadge(run)),
        h('td', { 'data-col': 'job', class: 'mono opt' }, run.job_id),
        h('td', { 'data-col': 'start', class: 'nowrap opt' }, timeEl(run.start_time_ms)),
        h('td', { 'data-col': 'duration', class: 'num' }, durationEl(run.start_time_ms, run.end_time_ms)),
        h('td', { 'data-col': 'workers', class: 'num' }, num(run.workers.length)),
        h('td', { 'data-col': 'gpus', class: 'num' }, num(gpuCount(run.workers))),
        h('td', { 'data-col': 'goodput', class: 'num opt', title: run.goodput ? 'The share of its wall-clock time that went into kept progress' : null },
          run.goodput && Number.isFinite(run.goodput.ratio) ? percent(run.goodput.ratio) : h('span', { class: 'muted' }, '—')),
        h('td', {
          'data-col': 'datasets', class: 'opt datasets',
          title: run.datasets.map((d) => d.dataset_name || d.name).join(', ') || null,
        }, datasets || h('span', { class: 'muted' }, '—')),
        h('td', { 'data-col': 'cluster', class: 'opt' }, run.cluster
          ? h('button', {
            type: 'button', class: 'link', title: `Only runs of cluster ${run.cluster}`,
            onclick: () => {
              st.cluster = clusterInput.value = run.cluster;
              restart();
            },
          }, run.cluster)
          : h('span', { class: 'muted' }, '—')));
    }

    const refreshSoon = throttle(load, MIN_REFRESH_MS);
    load();
    return { refresh: refreshSoon, onEvent: refreshSoon, close: () => { st.closed = true; } };
  }

  // ---- The run view ------------------------------------------------------

  const WORKER_SORTS = {
    world_rank: (w) => w.world_rank,
    local_rank: (w) => w.local_rank,
    node_rank: (w) => w.node_rank,
    node_id: (w) => w.node_id,
    node_ip: (w) => w.node_ip,
    pid: (w) => w.pid,
    gpu_ids: (w) => (w.gpu_ids.length ? w.gpu_ids[0] : -1),
    status: (w) => w.status,
  };

  function runView(id) {
    const st = {
      run: null, gone: null, error: null, seq: 0, closed: false,
      attempt: null, node: null, sort: 'world_rank', dir: 1, nodePage: 0, workerPage: 0,
      stacks: null, captureSeen: '', folds: {},
    };
    document.title = 'Run · trainstate';
    fill(app, h('p', { class: 'muted' }, 'Loading run…'));
    const rerender = () => keepFocus(render);

    async function load() {
      if (st.closed) return;
      const seq = ++st.seq;
      try {
        const run = await api(pathOf('getRun', { id }));
        // The metric histories of a run whose ranks report progress, and of
        // an ended run (kept in the store: the curve up to a crash).
        const metrics = Array.isArray(run.rank_progress) || ended(run)
          ? await api(pathOf('getRunMetrics', { id })).catch(() => null) : null;
        // The captures of its ranks' stacks (kept in the store), when it has any.
        const stacks = await api(pathOf('getRunStacks', { id })).catch(() => null);
        if (seq !== st.seq || st.closed) return;
        Object.assign(st, { run, metrics, stacks, captureSeen: captureKey(run), gone: null, error: null });
      } catch (err) {
        if (seq !== st.seq || st.closed) return;
        if (err.status === NOT_FOUND) st.gone = st.run ? 'deleted' : 'missing';
        else st.error = err;
      }
      keepFocus(render);
    }

    function onEvent(event) {
      if (event.run_id !== id || st.closed) return;
      st.seq++; // What the event says is newer than any load in flight.
      if (event.kind === 'deleted' || event.kind === 'evicted') st.gone = event.kind;
      else if (event.run) {
        const endsNow = ended(event.run) && st.run && !ended(st.run);
        // A stall's capture opened or completed: read its stacks again.
        const captureMoved = captureKey(event.run) !== st.captureSeen;
        Object.assign(st, { run: event.run, gone: null, error: null });
        // The run just ended: read it again for its ranks' last progress
        // and its whole metric histories.
        if (endsNow || captureMoved) setTimeout(load, 0);
      }
      keepFocus(render);
    }

    function render() {
      const run = st.run;
      const back = h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' },
        h('a', { href: pathOf('page'), 'data-nav': true }, '← All runs'));
      if (!run) {
        const text = st.gone ? `There is no run with id ${id}.` : null;
        fill(app, back,
          st.error ? errorNote(st.error) : h('p', { class: 'muted' }, text || 'Loading run…'));
        return;
      }
      document.title = `${line(run.name)} · trainstate`;
      const goneNote = st.gone ? h('p', { class: 'error', role: 'alert' },
        st.gone === 'evicted' ? 'The head evicted this run under its retention policy; this is its last known state.'
          : 'This run was deleted; this is its last known state.') : null;
      fill(app,
        back,
        h('div', { class: 'run-head' },
          h('h1', null, run.name),
          h('span', { id: 'run-status', 'data-col': 'status' }, badge(statusOf(run)), stalledBadge(run) ? ' ' : null, stalledBadge(run))),
        goneNote,
        st.error ? errorNote(st.error) : null,
        overview(run),
        progressSection(run),
        goodputSection(run),
        stacksSection(st.stacks),
        metricsSection(st.metrics),
        detailSection(run),
        historySection(run),
        datasetsSection(run),
        attemptsSection(run),
        ...workerSections(run));
    }

    function overview(run) {
      const item = (term, ...value) => h('div', { class: term === 'Run ID' ? 'wide' : null },
        h('dt', null, term), h('dd', null, value));
      const nodes = new Set(run.workers.map((w) => w.node_id)).size;
      const cause = run.cause;
      return h('dl', { class: 'facts' },
        item('Run ID', h('span', { class: 'mono', id: 'run-id' }, run.id), ' ', copyButton(run.id, 'run id')),
        item('Job ID', h('span', { class: 'mono' }, run.job_id)),
        item('Started', timeEl(run.start_time_ms)),
        item('Ended', run.end_time_ms === null || run.end_time_ms === undefined
          ? h('span', { class: 'muted' }, 'still running') : timeEl(run.end_time_ms)),
        item('Duration', durationEl(run.start_time_ms, run.end_time_ms)),
        item('Workers', `${plural(run.workers.length, 'worker')} on ${plural(nodes, 'node')}, ${plural(gpuCount(run.workers), 'GPU')}`),
        cause ? item('Cause', h('span', { id: 'run-cause' },
          ofRendezvous(run) && RANK_CAUSES[cause.kind]
            ? h('span', { title: cause.kind }, RANK_CAUSES[cause.kind])
            : [h('code', null, cause.kind), ` ${CAUSES[cause.kind] ? `(${CAUSES[cause.kind].toLowerCase()})` : ''}`],
          cause.failed_world_rank !== null && cause.failed_world_rank !== undefined
            ? [', first failed rank ', rankLink(cause.failed_world_rank)] : null,
          cause.how ? ` (${cause.how.toLowerCase()})` : null,
          cause.failed_at_ms ? [' at ', timeEl(cause.failed_at_ms)] : null,
          cause.class ? [' · ', classBadge(cause)] : null)) : null,
        run.last_heartbeat_ms ? item('Last heartbeat', timeEl(run.last_heartbeat_ms)) : null,
        run.restored_from ? item('Restored from',
          h('a', { href: runHref(run.restored_from), 'data-nav': true, class: 'mono' }, run.restored_from)) : null,
        ofRendezvous(run)
          ? item('Launch', h('span', { class: 'mono', title: run.controller_actor_id }, short(run.controller_actor_id.slice(RENDEZVOUS_PREFIX.length))))
          : item('Controller', h('span', { class: 'mono', title: run.controller_actor_id }, short(run.controller_actor_id))),
        run.controller_log_file_path ? item('Controller log', h('span', { class: 'mono' }, run.controller_log_file_path)) : null,
        linksOf(run, null).length ? item('Links', h('span', { id: 'run-links' }, ...linksOf(run, null).flatMap((a, i) => (i ? [' · ', a] : [a])))) : null);
    }

    /** A button that shows the worker of world rank `rank` in the workers table. */
    function rankLink(rank) {
      return h('button', {
        type: 'button', class: 'link', onclick: () => {
          Object.assign(st, { attempt: null, node: null, sort: 'world_rank', dir: 1 });
          st.workerPage = Math.floor(rank / WORKER_PAGE);
          rerender();
          const row = app.querySelector(`tr[data-world-rank="${rank}"]`);
          if (row) {
            row.classList.add('flash');
            row.scrollIntoView({ block: 'center' });
            row.focus({ preventScroll: true });
          }
        },
      }, String(rank));
    }

    /** The run's health and progress: a bar with the step, the total and an ETA (an ended run's: its ranks' last progress). */
    function progressSection(run) {
      const progress = progressOf(run);
      const health = run.health;
      if (!progress && !health) return null;
      const bar = progress ? h('div', { class: 'progress' },
        progress.total
          ? h('progress', { id: 'run-progress', max: String(progress.total), value: String(Math.min(progress.step, progress.total)) })
          : null,
        h('span', { id: 'run-step' },
          progress.total
            ? `step ${num(progress.step)} of ${num(progress.total)} (${Math.floor((100 * Math.min(progress.step, progress.total)) / progress.total)} %)`
            : `step ${num(progress.step)}`,
          progress.eta !== null ? h('span', { class: 'muted', id: 'run-eta' }, ` · about ${formatDuration(progress.eta)} left`) : null,
          progress.stalledSince !== null ? h('span', { class: 'muted', id: 'run-stalled-for' }, ' · stalled for ',
            h('span', { 'data-live-since': String(progress.stalledSince) }, formatDuration(Date.now() - progress.stalledSince))) : null)) : null;
      const endedStalled = health && Number.isFinite(health.ended_ms);
      // An ended run's health is history: no live badge, what it was at the end.
      const endedMoving = ended(run) && !endedStalled;
      const healthLine = health ? h('p', { id: 'run-health', 'data-health': endedStalled ? 'ENDED_STALLED' : health.state },
        endedStalled ? stalledBadge(run)
          : endedMoving ? h('span', { class: 'badge h-ended' }, `${String(health.state).toLowerCase()} when it ended`)
            : h('span', { class: `badge h-${String(health.state).toLowerCase()}` }, health.state),
        ' since ', timeEl(health.since_ms),
        health.ranks && health.ranks.length ? [', ranks ', ...health.ranks.flatMap((r, i) => (i ? [', ', rankLink(r)] : [rankLink(r)]))] : null,
        endedStalled ? [', until the run ended at ', timeEl(health.ended_ms)] : null,
        ) : null;
      const stragglers = health && Array.isArray(health.stragglers) ? health.stragglers : [];
      const stragglerLine = stragglers.length ? h('p', { id: 'run-stragglers' },
        stragglers.length === 1 ? 'Straggler: ' : 'Stragglers: ',
        ...stragglers.flatMap((s, i) => [i ? ', ' : null, 'rank ', rankLink(s.rank),
          ` ${ratioText(s.ratio)} (${stepTimeText(s.step_time_ms, s.step_time_ms)} a step, its peers ${stepTimeText(s.peers_step_time_ms, s.step_time_ms)})`]),
        ) : null;
      const detail = health && health.detail ? h('p', { class: 'health-detail', id: 'run-health-detail' }, line(health.detail)) : null;
      const last = ended(run) && progress ? h('p', { class: 'muted', id: 'run-last-progress' },
        'Where the ranks were when the run ended: ',
        lastPhases(run)) : null;
      return section(ended(run) ? 'Last progress' : 'Progress', healthLine, stragglerLine, detail, bar, last);
    }

    /**
     * What the run cost: its goodput as one bar split by bucket, with a
     * legend of each bucket's time and share, the ratio, the checkpoint
     * mark, and a badge when it restarts without getting anywhere. Absent
     * when the head counted none (a run registered already ended).
     */
    function goodputSection(run) {
      const g = run.goodput;
      if (!g || typeof g !== 'object') return null;
      const wall = Number(g.wall_ms) || 0;
      const parts = goodputParts(wall, g.productive_ms, g.badput);
      const mark = g.checkpoint;
      return section('Goodput', h('div', { id: 'goodput' },
        h('p', { id: 'goodput-summary' },
          h('strong', { id: 'goodput-ratio' }, percent(g.ratio)),
          ` of ${formatDuration(wall)} went into kept progress`,
          ended(run) ? null : h('span', { class: 'muted' }, ' (so far)'),
          g.restart_loop ? [' ', h('span', {
            class: 'badge h-stalled', id: 'goodput-restart-loop',
            title: `${plural(g.restarts_since_checkpoint, 'attempt')} failed since the last checkpoint`,
          }, 'restart loop')] : null),
        goodputBar(parts, `Goodput ${percent(g.ratio)}`, formatDuration),
        goodputLegend(parts, formatDuration),
        mark ? h('p', { id: 'goodput-checkpoint' }, `Checkpoint: step ${num(mark.step)} saved at `, timeEl(mark.at_ms),
          ` (attempt ${line(mark.attempt_id)})`)
          : h('p', { class: 'muted', id: 'goodput-checkpoint' }, 'No checkpoint marked: nothing is counted as lost at a failure.'),
        g.restart_loop ? h('p', { class: 'error', id: 'goodput-loop-detail' },
          `Restart loop: ${plural(g.restarts_since_checkpoint, 'attempt')} failed since the last checkpoint.`) : null));
    }

    /** The ranks' last steps and phases, grouped: `ranks 0, 1 at step 60 (train)`. */
    function lastPhases(run) {
      const groups = new Map();
      run.rank_progress.forEach((p, rank) => {
        if (!p || !Number.isFinite(p.step)) return;
        const key = `step ${num(p.step)}${p.phase ? ` (${line(p.phase)})` : ''}`;
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(rank);
      });
      const shown = [...groups.entries()].slice(0, 8).map(([key, members]) =>
        `${members.length === 1 ? 'rank' : 'ranks'} ${members.slice(0, 8).join(', ')}${members.length > 8 ? ` and ${num(members.length - 8)} more` : ''} at ${key}`);
      return `${shown.join('; ')}${groups.size > 8 ? '; …' : ''}.`;
    }

    /** How many times its peers' time a straggler takes: `2.0×`. */
    function ratioText(ratio) {
      return `${Number(ratio).toFixed(1)}\u00d7`;
    }

    /** A time per step in the unit and grain that suit `largest` (ms), as the head's detail writes it: `0.20 s`, `12.5 s`, `3.2 ms`. */
    function stepTimeText(ms, largest) {
      if (largest < 100) return `${ms.toFixed(1)} ms`;
      return largest < 10000 ? `${(ms / 1000).toFixed(2)} s` : `${(ms / 1000).toFixed(1)} s`;
    }

    /** One plot per metric: its value over steps, a line per rank (SVG, drawn here). */
    /**
     * Where the ranks are (or were) stuck: each capture of their stacks,
     * newest first, the suspects first, then the groups, each rank's stack
     * folded. Stack text is only ever text, never markup.
     */
    function stacksSection(stacks) {
      const captures = stacks && Array.isArray(stacks.captures) ? stacks.captures : [];
      if (!captures.length) return null;
      return section('Stacks', h('div', { id: 'stacks' }, captures.map((capture, i) => captureView(capture, i === 0))));
    }

    function captureView(capture, newest) {
      const suspects = Array.isArray(capture.suspects) ? capture.suspects : [];
      const groups = Array.isArray(capture.groups) ? capture.groups : [];
      const suspectRanks = new Set(suspects.map((s) => s.rank));
      const ranks = (Array.isArray(capture.ranks) ? capture.ranks.slice() : [])
        .sort((a, b) => (suspectRanks.has(b.rank) - suspectRanks.has(a.rank)) || a.rank - b.rank);
      const why = capture.trigger === 'STALLED' ? 'the run stalled' : capture.trigger === 'REQUESTED' ? 'asked for' : 'attached by the controller';
      const head = h('p', { class: 'capture-head' },
        h('strong', null, `Capture ${capture.capture_id}`), ` of attempt ${capture.attempt_id}, `, why, ', ', timeEl(capture.at_ms),
        capture.state === 'PENDING' ? [' · ', h('span', { class: 'badge h-stalled' }, 'waiting for ranks')] : null);
      const reason = capture.reason ? h('p', { class: 'muted' }, capture.reason) : null;
      const suspectList = suspects.length
        ? h('ul', { class: 'suspects', 'aria-label': 'Suspect ranks' }, suspects.map((s) => h('li', { 'data-rank': String(s.rank) },
          h('strong', null, `rank ${s.rank}`), s.node ? ` on ${s.node}` : null, ': ', h('code', null, s.innermost))))
        : h('p', { class: 'muted' }, capture.state === 'PENDING' ? 'No suspect yet.' : 'Every rank that answered is in one place.');
      const groupRows = groups.map((g, i) => h('tr', { 'data-group': String(i) },
        h('td', null, i === 0 ? 'largest' : `${i + 1}`),
        h('td', null, g.ranks.join(', ')),
        h('td', null, h('code', null, g.innermost))));
      const groupTable = groups.length ? table('Groups', [['Group', ''], ['Ranks', ''], ['Innermost frame', '']], groupRows) : null;
      const rankStacks = ranks.map((r) => {
        const pre = h('pre', { class: 'detail stack', tabindex: '0', 'aria-label': `Stack of rank ${r.rank}` });
        pre.textContent = block(r.answered ? r.stack : (r.note || 'no answer'));
        // A stack a person opened or closed stays so across renders.
        const key = `${capture.capture_id}:${r.rank}`;
        const open = key in st.folds ? st.folds[key] : newest && suspectRanks.has(r.rank);
        return h('details', {
          class: 'rank-stack', 'data-rank': String(r.rank), open,
          ontoggle: (event) => { st.folds[key] = event.target.open; },
        },
          h('summary', null, `rank ${r.rank}`, r.node ? ` · ${r.node}` : null,
            r.answered ? ` · ${r.source || ''}` : ' · no answer',
            r.truncated ? ' · truncated' : null,
            suspectRanks.has(r.rank) ? [' · ', h('strong', null, 'suspect')] : null),
          pre);
      });
      return h('div', { class: 'capture', 'data-capture': String(capture.capture_id), 'data-state': capture.state },
        head, reason, suspectList, groupTable, rankStacks);
    }

    function metricsSection(metrics) {
      const series = metrics && Array.isArray(metrics.series) ? metrics.series.filter((s) => s.points.length) : [];
      if (!series.length) return null;
      return section('Metrics', h('div', { class: 'plots', id: 'metrics' }, ...series.map(plot)));
    }

    /** About `count` round tick values (1, 2 or 5 times a power of ten) from `lo` to `hi`. */
    function ticks(lo, hi, count, integers) {
      if (!(hi > lo)) return [lo];
      const raw = (hi - lo) / count;
      const power = 10 ** Math.floor(Math.log10(raw));
      let step = [1, 2, 5, 10].map((m) => m * power).find((m) => m >= raw) || 10 * power;
      if (integers) step = Math.max(1, Math.round(step));
      const out = [];
      for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)));
      return out;
    }

    /** A value as a person reads it: 3 significant digits, exponents only when very large or small. */
    function valueText(v) {
      if (v === 0) return '0';
      const a = Math.abs(v);
      if (a >= 1e6 || a < 1e-3) return v.toExponential(1);
      return String(Number(v.toPrecision(3)));
    }

    /** A rank's colour class: the same rank has the same colour in every plot and legend. */
    const rankColour = (rank) => `c${rank % 10}`;

    /** Most ranks a legend names one by one; the rest are counted. */
    const LEGEND_RANKS = 16;

    function plot(series) {
      const [width, height, padL, padR, padT, padB] = [360, 160, 46, 10, 10, 26];
      const [left, right, top, bottom] = [padL, width - padR, padT, height - padB];
      const points = series.points;
      const steps = points.map((p) => p.step);
      const values = points.map((p) => p.value);
      const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
      const [y0, y1] = [Math.min(...values), Math.max(...values)];
      const x = (step) => left + (x1 > x0 ? ((step - x0) / (x1 - x0)) * (right - left) : (right - left) / 2);
      const y = (value) => bottom - (y1 > y0 ? ((value - y0) / (y1 - y0)) * (bottom - top) : (bottom - top) / 2);
      const byRank = new Map();
      for (const p of points) {
        if (!byRank.has(p.rank)) byRank.set(p.rank, []);
        byRank.get(p.rank).push(p);
      }
      const ranks = [...byRank.keys()].sort((a, b) => a - b);
      const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
      svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
      svg.setAttribute('role', 'img');
      svg.setAttribute('aria-label', `${series.name} over steps ${x0} to ${x1}, ${plural(ranks.length, 'rank')}`);
      svg.setAttribute('data-metric', series.name);
      const add = (tag, attrs, text, parent = svg) => {
        const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
        for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
        if (text !== undefined) el.textContent = text;
        parent.appendChild(el);
        return el;
      };
      // Axes, with round ticks: steps below, values on the left.
      for (const t of ticks(y0, y1, 4, false)) {
        add('line', { x1: left, y1: y(t), x2: right, y2: y(t), class: 'grid' });
        add('text', { x: left - 4, y: y(t) + 3, class: 'tick y-tick', 'text-anchor': 'end' }, valueText(t));
      }
      for (const t of ticks(x0, x1, 4, true)) {
        add('line', { x1: x(t), y1: bottom, x2: x(t), y2: bottom + 3, class: 'axis' });
        add('text', { x: x(t), y: bottom + 12, class: 'tick x-tick', 'text-anchor': 'middle' }, num(t));
      }
      add('line', { x1: left, y1: bottom, x2: right, y2: bottom, class: 'axis' });
      add('line', { x1: left, y1: top, x2: left, y2: bottom, class: 'axis' });
      add('text', { x: right, y: height - 2, class: 'tick axis-name', 'text-anchor': 'end' }, 'step');
      for (const rank of ranks) {
        const pts = byRank.get(rank);
        const attrs = { class: `series ${rankColour(rank)}`, 'data-rank': rank };
        if (pts.length === 1) add('circle', { ...attrs, cx: x(pts[0].step).toFixed(1), cy: y(pts[0].value).toFixed(1), r: 2 });
        else add('polyline', { ...attrs, points: pts.map((p) => `${x(p.step).toFixed(1)},${y(p.value).toFixed(1)}`).join(' ') });
      }
      // The value under the pointer: the nearest point, its rank, step and value.
      const guide = add('line', { x1: 0, y1: top, x2: 0, y2: bottom, class: 'guide', visibility: 'hidden' });
      const dot = add('circle', { cx: 0, cy: 0, r: 3, class: 'dot', visibility: 'hidden' });
      const tip = h('div', { class: 'plot-tip', role: 'status', hidden: true });
      const hide = () => {
        guide.setAttribute('visibility', 'hidden');
        dot.setAttribute('visibility', 'hidden');
        tip.hidden = true;
      };
      const show = (event) => {
        const box = svg.getBoundingClientRect();
        if (!box.width || !box.height) return;
        const px = ((event.clientX - box.left) * width) / box.width;
        const py = ((event.clientY - box.top) * height) / box.height;
        let best = null;
        let bestDistance = Infinity;
        for (const p of points) {
          const distance = (x(p.step) - px) ** 2 + ((y(p.value) - py) ** 2) / 4;
          if (distance < bestDistance) [best, bestDistance] = [p, distance];
        }
        if (!best) return hide();
        const [bx, by] = [x(best.step), y(best.value)];
        guide.setAttribute('x1', bx.toFixed(1));
        guide.setAttribute('x2', bx.toFixed(1));
        dot.setAttribute('cx', bx.toFixed(1));
        dot.setAttribute('cy', by.toFixed(1));
        dot.setAttribute('class', `dot ${rankColour(best.rank)}`);
        guide.setAttribute('visibility', 'visible');
        dot.setAttribute('visibility', 'visible');
        fill(tip, h('span', { class: `swatch ${rankColour(best.rank)}` }), `rank ${best.rank} · step ${num(best.step)} · ${valueText(best.value)}`);
        tip.setAttribute('data-rank', String(best.rank));
        tip.setAttribute('data-step', String(best.step));
        tip.setAttribute('data-value', String(best.value));
        tip.style.left = `${((bx / width) * 100).toFixed(1)}%`;
        tip.style.top = `${((by / height) * 100).toFixed(1)}%`;
        tip.classList.toggle('flip', bx > width / 2);
        tip.hidden = false;
      };
      add('rect', { x: left, y: top, width: right - left, height: bottom - top, class: 'hover' });
      svg.addEventListener('pointermove', show);
      svg.addEventListener('pointerleave', hide);
      const named = ranks.slice(0, LEGEND_RANKS);
      const legend = h('ul', { class: 'legend', 'aria-label': `Ranks of ${series.name}` },
        ...named.map((rank) => h('li', { 'data-rank': rank }, h('span', { class: `swatch ${rankColour(rank)}`, 'aria-hidden': 'true' }), `rank ${rank}`)),
        ranks.length > named.length ? h('li', { class: 'muted' }, `and ${plural(ranks.length - named.length, 'more rank')}`) : null);
      return h('figure', { class: 'plot' }, h('div', { class: 'plot-area' }, svg, tip),
        h('figcaption', null, h('span', { class: 'plot-name' }, line(series.name)), legend));
    }

    function detailSection(run) {
      if (!run.status_detail) return null;
      const title = run.run_status === 'ERRORED' ? 'Error' : run.run_status === 'ABORTED' ? 'Reason' : 'Status detail';
      const pre = h('pre', { class: 'detail', id: 'status-detail', tabindex: '0', 'aria-label': title });
      pre.textContent = block(run.status_detail);
      return section(title, pre);
    }

    /** The run's status changes, oldest first: status, time, attempt, detail. */
    function historySection(run) {
      const history = run.status_history || [];
      if (!history.length) return null;
      const items = history.map((c, i) => h('li', { class: 'change', 'data-status': c.status },
        h('span', { 'data-col': 'change-status' }, badge(c.status)),
        h('span', { class: 'change-time' }, timeEl(c.at_ms),
          i ? h('span', { class: 'muted' }, ` (+${formatDuration(Math.max(0, c.at_ms - history[0].at_ms))})`) : null),
        c.attempt_id ? h('span', { class: 'muted' }, `attempt ${line(c.attempt_id)}`) : null,
        c.detail ? h('span', { class: 'change-detail', title: c.detail }, line(c.detail)) : null));
      return section('Status history', h('ol', { class: 'changes', id: 'status-history' }, items));
    }

    function datasetsSection(run) {
      if (!run.datasets.length) return section('Datasets', h('p', { class: 'muted' }, 'No datasets.'));
      return section('Datasets', table('Datasets', [['Name'], ['Dataset name'], ['UUID']],
        run.datasets.map((d) => h('tr', null,
          h('td', null, d.name),
          h('td', null, d.dataset_name ?? h('span', { class: 'muted' }, '—')),
          h('td', { class: 'mono' }, d.dataset_uuid)))));
    }

    function attemptsSection(run) {
      const attempts = run.attempts || [];
      if (!attempts.length) {
        return section('Attempts', h('p', { class: 'muted' }, 'This run was reported without attempt history.'));
      }
      const over = ended(run);
      const endOf = (a, i) => a.end_time_ms ?? (i === attempts.length - 1 && over ? run.end_time_ms : null);
      const t0 = Math.min(run.start_time_ms, attempts[0].start_time_ms);
      const t1 = Math.max(...attempts.map((a, i) => endOf(a, i) ?? Date.now()), over ? run.end_time_ms : Date.now());
      const span = Math.max(1, t1 - t0);
      const budget = attemptBudget(run);
      const items = attempts.map((a, i) => {
        const current = i === attempts.length - 1;
        const cause = a.cause ? h('span', { class: 'attempt-cause' }, ` · ${causeLabel(run, a.cause.kind) || a.cause.kind}`,
          a.cause.failed_world_rank !== null && a.cause.failed_world_rank !== undefined
            ? [', first failed rank ', rankLink(a.cause.failed_world_rank)] : null,
          a.cause.how ? ` (${a.cause.how.toLowerCase()})` : null,
          a.cause.class ? [' · ', classBadge(a.cause)] : null) : null;
        const end = endOf(a, i);
        const workers = current ? run.workers : a.workers || [];
        const left = ((a.start_time_ms - t0) / span) * 100;
        const width = Math.max(0.6, (((end ?? Date.now()) - a.start_time_ms) / span) * 100);
        const shown = (st.attempt ?? null) === (current ? null : a.attempt_id);
        return h('li', { class: `attempt${shown ? ' shown' : ''}`, 'data-attempt-id': a.attempt_id },
          h('div', { class: 'attempt-name' }, `Attempt ${line(a.attempt_id)}`,
            budget ? h('span', { class: 'muted' }, ` (${i + 1} of at most ${budget})`) : null,
            current ? h('span', { class: 'tag' }, 'current') : null),
          h('div', { class: 'track', 'aria-hidden': 'true' },
            h('div', { class: `bar${end === null ? ' live' : ''}`, style: { left: `${left}%`, width: `${Math.min(width, 100 - left)}%` } })),
          h('div', { class: 'attempt-meta' },
            a.status ? [h('span', { 'data-col': 'attempt-status' }, badge(a.status)), ' '] : null,
            `${formatTime(a.start_time_ms)} → ${end === null ? 'now' : formatTime(end)} · `,
            durationEl(a.start_time_ms, end), ` · ${plural(workers.length, 'worker')}`, cause, ' · ',
            h('button', {
              type: 'button', class: 'link', 'aria-pressed': String(shown), 'data-key': `attempt-${a.attempt_id}`,
              onclick: () => {
                Object.assign(st, { attempt: current ? null : a.attempt_id, node: null, nodePage: 0, workerPage: 0 });
                rerender();
              },
            }, shown ? 'workers shown below' : 'show workers')));
      });
      const title = budget ? `Attempts (${attempts.length} of at most ${budget})` : 'Attempts';
      return section(title, h('ol', { class: 'timeline' }, items));
    }

    /** A rank's step (labelled when the run's health names it a straggler), phase and last advance, as table cells. */
    function progressCells(p, straggler) {
      const none = () => h('span', { class: 'muted' }, '—');
      const label = straggler ? h('span', { class: 'badge straggler', 'data-straggler': String(straggler.ratio) }, `straggler ${ratioText(straggler.ratio)}`) : null;
      if (!p) return [h('td', { class: 'num', 'data-col': 'step' }, none(), label), h('td', { 'data-col': 'phase' }, none()), h('td', { 'data-col': 'last_advance' }, none())];
      return [
        h('td', { class: 'num', 'data-col': 'step' }, Number.isFinite(p.step) ? num(p.step) : none(), label),
        h('td', { 'data-col': 'phase' }, p.phase ? line(p.phase) : none()),
        h('td', { 'data-col': 'last_advance' }, timeEl(p.last_advance_ms)),
      ];
    }

    function workerSections(run) {
      const attempts = run.attempts || [];
      const old = st.attempt === null ? null : attempts.find((a) => a.attempt_id === st.attempt && a.workers);
      if (!old) st.attempt = null;
      const all = old ? old.workers : run.workers;
      // When each rank was last heard from (rendezvous runs, current attempt only).
      const heard = !old && Array.isArray(run.rank_last_heartbeat_ms) ? run.rank_last_heartbeat_ms : null;
      // Each rank's progress (current attempt only), and the ranks health names.
      const progress = !old && Array.isArray(run.rank_progress) && run.rank_progress.some(Boolean) ? run.rank_progress : null;
      const named = new Set(run.health && run.health.state === 'STALLED' && Array.isArray(run.health.ranks) ? run.health.ranks : []);
      const stragglers = new Map(!old && run.health && Array.isArray(run.health.stragglers) ? run.health.stragglers.map((s) => [s.rank, s]) : []);
      const of = old ? ` of attempt ${line(old.attempt_id)}` : '';

      // One row per node, by node rank.
      const byNode = new Map();
      for (const w of all) {
        let node = byNode.get(w.node_id);
        if (!node) byNode.set(w.node_id, node = { id: w.node_id, name: w.node_name, ip: w.node_ip, rank: w.node_rank, workers: 0, gpus: 0, dead: 0 });
        node.workers += 1;
        node.gpus += w.gpu_ids.length;
        if (w.status !== 'ALIVE') node.dead += 1;
      }
      const nodes = [...byNode.values()].sort((a, b) => a.rank - b.rank);
      if (st.node !== null && !byNode.has(st.node)) st.node = null;
      const nodePages = Math.max(1, Math.ceil(nodes.length / NODE_PAGE));
      st.nodePage = Math.min(st.nodePage, nodePages - 1);
      const nodeRows = nodes.slice(st.nodePage * NODE_PAGE, (st.nodePage + 1) * NODE_PAGE).map((n) => {
        const selected = st.node === n.id;
        return h('tr', { 'data-node-id': n.id, class: selected ? 'selected' : null },
          h('td', { class: 'num' }, String(n.rank)),
          h('td', { class: 'mono', title: n.id, 'data-col': 'node' }, nodeText(n.name, n.id)),
          h('td', { class: 'mono' }, n.ip),
          h('td', { class: 'num' }, num(n.workers)),
          h('td', { class: 'num' }, num(n.gpus)),
          h('td', { class: 'num' }, n.dead ? num(n.dead) : h('span', { class: 'muted' }, '0')),
          h('td', null, h('button', {
            type: 'button', class: 'link', 'aria-pressed': String(selected), 'data-key': `node-${n.id}`,
            onclick: () => {
              st.node = selected ? null : n.id;
              st.workerPage = 0;
              rerender();
            },
          }, selected ? 'show all nodes' : 'only this node')));
      });
      const nodeSection = section(`Nodes${of}`,
        table('Nodes', [['Node rank', 'num'], ['Node ID'], ['Node IP'], ['Workers', 'num'], ['GPUs', 'num'], ['Dead', 'num'], ['Filter']],
          nodeRows, { id: 'nodes' }),
        nodes.length > NODE_PAGE ? pager('nodes', 'Pages of nodes', {
          from: st.nodePage * NODE_PAGE + 1, to: Math.min(nodes.length, (st.nodePage + 1) * NODE_PAGE), total: nodes.length,
          first: st.nodePage > 0 ? () => { st.nodePage = 0; rerender(); } : null,
          prev: st.nodePage > 0 ? () => { st.nodePage -= 1; rerender(); } : null,
          next: st.nodePage < nodePages - 1 ? () => { st.nodePage += 1; rerender(); } : null,
          last: st.nodePage < nodePages - 1 ? () => { st.nodePage = nodePages - 1; rerender(); } : null,
        }) : null);

      // The workers, filtered to a node, sorted, one page at a time.
      const workerLinks = Boolean(links && ['logs', 'metrics'].some((k) => links[k] && perWorker(links[k])));
      const key = WORKER_SORTS[st.sort];
      const shown = (st.node === null ? all.slice() : all.filter((w) => w.node_id === st.node))
        .sort((a, b) => {
          const x = key(a);
          const y = key(b);
          return (x < y ? -1 : x > y ? 1 : a.world_rank - b.world_rank) * st.dir;
        });
      const pages = Math.max(1, Math.ceil(shown.length / WORKER_PAGE));
      st.workerPage = Math.min(st.workerPage, pages - 1);
      const start = st.workerPage * WORKER_PAGE;
      const rows = shown.slice(start, start + WORKER_PAGE).map((w) => h('tr', {
        'data-world-rank': w.world_rank, 'data-node-id': w.node_id, tabindex: '-1',
        class: named.has(w.world_rank) ? 'culprit' : stragglers.has(w.world_rank) ? 'straggler' : null,
        title: named.has(w.world_rank) ? 'named by the run\'s health'
          : stragglers.has(w.world_rank) ? 'a straggler: its steps are persistently slower than its peers\'' : null,
      },
      h('td', { class: 'num', 'data-col': 'world_rank' }, String(w.world_rank)),
      h('td', { class: 'num' }, String(w.local_rank)),
      h('td', { class: 'num' }, String(w.node_rank)),
      h('td', { class: 'mono', title: w.node_id, 'data-col': 'node' }, nodeText(w.node_name, w.node_id)),
      h('td', { class: 'mono' }, w.node_ip),
      h('td', { class: 'num' }, String(w.pid)),
      h('td', { class: 'mono' }, w.gpu_ids.length ? w.gpu_ids.join(', ') : h('span', { class: 'muted' }, '—')),
      h('td', { 'data-col': 'status' }, h('span', { class: `badge w-${String(w.status).toLowerCase()}` }, w.status)),
      heard ? h('td', { 'data-col': 'last_heard' }, timeEl(heard[w.world_rank])) : null,
      ...(progress ? progressCells(progress[w.world_rank], stragglers.get(w.world_rank)) : []),
      ...(workerLinks ? [h('td', { class: 'links' }, ...linksOf(run, w).flatMap((a, i) => (i ? [' · ', a] : [a])))] : [])));
      const sortHead = (label, field, cls) => {
        const sorted = st.sort === field;
        return h('th', { scope: 'col', class: cls, 'aria-sort': sorted ? (st.dir > 0 ? 'ascending' : 'descending') : null },
          h('button', {
            type: 'button', class: 'sort', 'data-key': `sort-${field}`,
            onclick: () => {
              st.dir = sorted ? -st.dir : 1;
              st.sort = field;
              st.workerPage = 0;
              rerender();
            },
          }, label, h('span', { class: 'arrow', 'aria-hidden': 'true' }, sorted ? (st.dir > 0 ? '▲' : '▼') : '')));
      };
      const nodeNote = st.node === null ? null : h('p', { class: 'filter-note' },
        `Showing the ${plural(shown.length, 'worker')} on node `, h('span', { class: 'mono', title: st.node }, short(st.node)), '. ',
        h('button', { type: 'button', class: 'link', onclick: () => { st.node = null; rerender(); } }, 'Show all workers'));
      const workerSection = section(`Workers${of}`, nodeNote,
        table('Workers', [
          sortHead('World rank', 'world_rank', 'num'), sortHead('Local rank', 'local_rank', 'num'),
          sortHead('Node rank', 'node_rank', 'num'), sortHead('Node ID', 'node_id'), sortHead('Node IP', 'node_ip'),
          sortHead('PID', 'pid', 'num'), sortHead('GPU IDs', 'gpu_ids'), sortHead('Status', 'status'),
          heard ? h('th', { scope: 'col' }, 'Last heard') : null,
          ...(progress ? ['Step', 'Phase', 'Last advance'].map((t) => h('th', { scope: 'col' }, t)) : []),
          ...(workerLinks ? [h('th', { scope: 'col' }, 'Links')] : []),
        ].filter(Boolean), rows.length ? rows : h('tr', null, h('td', { colspan: 8 + (heard ? 1 : 0) + (progress ? 3 : 0) + (workerLinks ? 1 : 0), class: 'empty' }, 'No workers.')), { id: 'workers' }),
        shown.length > WORKER_PAGE ? pager('workers', 'Pages of workers', {
          from: start + 1, to: Math.min(shown.length, start + WORKER_PAGE), total: shown.length,
          first: st.workerPage > 0 ? () => { st.workerPage = 0; rerender(); } : null,
          prev: st.workerPage > 0 ? () => { st.workerPage -= 1; rerender(); } : null,
          next: st.workerPage < pages - 1 ? () => { st.workerPage += 1; rerender(); } : null,
          last: st.workerPage < pages - 1 ? () => { st.workerPage = pages - 1; rerender(); } : null,
        }) : null);
      return [nodeSection, workerSection];
    }

    load();
    loadLinks().then(() => { if (!st.closed && st.run) rerender(); });
    return { refresh: throttle(load, MIN_REFRESH_MS), onEvent, close: () => { st.closed = true; } };
  }

  route();
  connect();
})();
