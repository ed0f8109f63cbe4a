// diffstore console: plain JavaScript, no build step, nothing from another host.
// It talks to the JSON API of the server that served it (SPEC §3 plus /overview, /overview/changes and
// /collections/{c}/generations; /collections/{c}/lineage), sending the bearer token kept in this tab's sessionStorage.
"use strict";

const TOKEN_KEY = "diffstore.token";
const LONG_POLL_MS = 25000;
const FIRST_ROWS = 60;
const ROWS_PER_TASK = 200;
const FIRST_TIMES = 20; // the collections whose commit times are asked for before the rest of the rows
const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  view: null, // {abort: AbortController}
  overview: null,
  readerSeen: new Map(), // "owner/reader" -> {gen, movedAt}
  livePolls: 0,
};
const main = () => document.getElementById("view");

// ---- bytes, EncodedStrings and how values are shown -------------------------------------------------

const utf8 = new TextDecoder("utf-8", { fatal: true });
// Not printable, as the command line decides (Python's str.isprintable): control, format, unassigned,
// private-use and surrogate characters, and every separator but the space.
const UNPRINTABLE = /(?! )[\p{C}\p{Z}]/u;
// The command line's one text form for bytes that are not printable UTF-8 (diffstore/shell.py).
const PREFIX = "base64:";
// Text beginning with "@" or "~" is a ref (`@current`, `~1`: see resolveGeneration), so an id beginning so
// is shown and typed in base64 form, as the command line does.
const REF = /^[@~]/;

function esToBytes(es) {
  if (es === null || es === undefined) return null;
  if (es.encoding === "base64") {
    const bin = atob(es.value);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  return new TextEncoder().encode(es.value);
}

function bytesToEs(bytes) {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return { value: btoa(bin), encoding: "base64" };
}

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function asText(bytes) {
  try {
    const text = utf8.decode(bytes);
    return UNPRINTABLE.test(text) ? null : text;
  } catch {
    return null;
  }
}

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// A key or value as HTML, in the command line's text form: UTF-8 text when it decodes and is printable,
// else "base64:..." (marked, with its length).
function valueHtml(es) {
  const bytes = esToBytes(es);
  if (bytes === null) return '<span class="null">null</span>';
  const label = textForm(es);
  if (!label.startsWith(PREFIX)) return `<span class="value">${esc(label)}</span>`;
  return `<span class="value binary" title="${bytes.length} bytes, not printable UTF-8">${esc(label)}</span>`;
}

// Keys and values typed or shown in the console, as the command line prints and accepts them: printable
// UTF-8 as it is, else "base64:" and the standard base64 (so is text that begins with "base64:").
function textForm(es) {
  const bytes = esToBytes(es);
  if (bytes === null) return "null";
  const text = asText(bytes);
  if (text === null || text.startsWith(PREFIX)) return PREFIX + bytesToEs(bytes).value;
  return text;
}

// Generation ids likewise, and an id beginning with "@" or "~" in base64 form too: typed, it would be a ref.
function idLabel(es) {
  const label = textForm(es);
  return REF.test(label) ? PREFIX + bytesToEs(esToBytes(es)).value : label;
}

function parseLabel(label) {
  if (label.startsWith(PREFIX)) {
    const digits = label.slice(PREFIX.length);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(digits) || digits.length % 4 !== 0) throw new Error(`not base64: ${label}`);
    return { value: digits, encoding: "base64" };
  }
  return { value: label };
}

function sameEs(a, b) {
  if (!a || !b) return a === b;
  return hex(esToBytes(a)) === hex(esToBytes(b));
}

function labelHtml(es) {
  if (es === null || es === undefined) return '<span class="null">none</span>';
  const label = idLabel(es);
  return label === "" ? '<code class="muted">""</code>' : `<code>${esc(label)}</code>`;
}

// ---- the API, the token ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.reason ? `${body.error}: ${body.reason}` : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

let tokenRequest = null;

function askToken(refused) {
  if (tokenRequest) return tokenRequest;
  tokenRequest = new Promise((resolve) => {
    const dialog = document.getElementById("token-dialog");
    const input = document.getElementById("token-input");
    document.getElementById("token-error").hidden = !refused;
    input.value = "";
    const done = (event) => {
      event.preventDefault();
      if (!input.value) return;
      setToken(input.value);
      dialog.close();
      document.getElementById("token-form").removeEventListener("submit", done);
      tokenRequest = null;
      resolve();
    };
    document.getElementById("token-form").addEventListener("submit", done);
    dialog.addEventListener("cancel", (event) => event.preventDefault(), { once: true });
    dialog.showModal();
    input.focus();
  });
  return tokenRequest;
}

function setToken(token) {
  state.token = token;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("forget-token").hidden = !token;
}

async function api(method, path, body, signal) {
  for (;;) {
    const headers = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (state.token) headers.authorization = "Bearer " + state.token;
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (response.status === 401) {
      await askToken(Boolean(state.token));
      continue;
    }
    const data = await response.json().catch(() => null);
    // An answer that arrived as its view was left must not let that view draw, or rewrite the address,
    // over the next one (render() ignores errors of a left view).
    if (signal && signal.aborted) throw new DOMException("the view was left", "AbortError");
    if (!response.ok) throw new ApiError(response.status, data);
    if (data === null) throw new Error(`the answer to ${method} ${path} is not the API's JSON`);
    return data;
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });

function showError(error) {
  if (error && error.name === "AbortError") return;
  const box = document.getElementById("error");
  box.textContent = String(error && error.message ? error.message : error);
  box.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

function setLive(delta) {
  state.livePolls += delta;
  document.getElementById("live-status").textContent = state.livePolls > 0 ? "● live" : "";
}

// "." and ".." are no collection names (the server refuses them): a browser would resolve them as dot
// segments of the path (even percent-encoded) and ask another route, so they are refused here.
function collectionPath(name) {
  if (name === "." || name === "..") {
    throw new Error(`"${name}" is not a collection name (collection names cannot be "." or "..")`);
  }
  return "/collections/" + encodeURIComponent(name);
}

// Follows a collection's commits with the long poll of generationId/stream; calls onCommit(newId).
async function follow(signal, name, generation, onCommit) {
  let current = generation;
  setLive(1);
  try {
    while (!signal.aborted) {
      try {
        const query = new URLSearchParams({ generationId: current.value, timeoutMs: String(LONG_POLL_MS) });
        if (current.encoding) query.set("generationIdEncoding", current.encoding);
        const answer = await api("GET", `${collectionPath(name)}/generationId/stream?${query}`, undefined, signal);
        if (!sameEs(answer.generationId, current)) {
          current = answer.generationId;
          await onCommit(current);
        }
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof ApiError && error.status === 404) return; // the collection is gone
        await sleep(1000, signal);
      }
    }
  } finally {
    setLive(-1);
  }
}

// Follows the store-wide overview (GET /overview/changes, a long poll); calls onChange() on every change.
async function followOverview(signal, onChange) {
  let version = null;
  setLive(1);
  try {
    while (!signal.aborted) {
      try {
        const query = version === null ? "" : `?since=${version}&timeoutMs=${LONG_POLL_MS}`;
        const answer = await api("GET", `/overview/changes${query}`, undefined, signal);
        if (version !== null && answer.version !== version) await onChange();
        version = answer.version;
      } catch (error) {
        if (signal.aborted) return;
        await sleep(1000, signal);
      }
    }
  } finally {
    setLive(-1);
  }
}

function noteReaders(overview) {
  const now = Date.now();
  for (const c of overview.collections) {
    for (const r of c.readers) {
      const key = `${c.name}/${r.readerName}`;
      const gen = r.generationId === null ? null : idLabel(r.generationId);
      const seen = state.readerSeen.get(key);
      if (!seen) state.readerSeen.set(key, { gen, movedAt: null });
      else if (seen.gen !== gen) state.readerSeen.set(key, { gen, movedAt: now });
    }
  }
}

async function loadOverview(signal) {
  const overview = await api("GET", "/overview", undefined, signal);
  noteReaders(overview);
  state.overview = overview;
  return overview;
}

// ---- commit times ----------------------------------------------------------------------------------

// "3 min ago": how long before this page's clock (the server's clock stamped the commit; a small skew
// between the two clocks reads as "just now", never as a time in the future).
function ago(ms) {
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 2) return s < -5 ? `${-s} s from now (the clocks differ)` : "just now";
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

// Local time: the time of day alone when it is today, else the date too.
function localTime(ms) {
  const at = new Date(ms);
  return at.toDateString() === new Date().toDateString() ? at.toLocaleTimeString() : at.toLocaleString();
}

const whenText = (ms) => `${localTime(ms)} · ${ago(ms)}`;

// What is known of a committed generation ({committedAtMs, changedKeys, metadata}, or null when it is not
// a committed generation of the collection), one request per generation, kept for the page's life (a
// committed generation's commit row never changes). The listing's `before` is exclusive, so asking below
// the smallest id after G (G + a zero byte) answers G first when G is committed.
const generationInfos = new Map();
const generationsKnown = new Map(); // the answers already in: a redrawn id shows its time at once

function rememberGenerations(name, items) {
  for (const item of items) {
    const key = `${name}\n${hex(esToBytes(item.generationId))}`;
    generationInfos.set(key, Promise.resolve(item));
    generationsKnown.set(key, item);
  }
}

function generationInfo(name, es) {
  const key = `${name}\n${hex(esToBytes(es))}`;
  if (!generationInfos.has(key)) {
    const bytes = esToBytes(es);
    const after = new Uint8Array(bytes.length + 1);
    after.set(bytes);
    const query = new URLSearchParams({ limit: "1", before: bytesToEs(after).value, beforeEncoding: "base64" });
    const asked = api("GET", `${collectionPath(name)}/generations?${query}`).then((list) => {
      if (list.items.length && sameEs(list.items[0].generationId, es)) {
        generationsKnown.set(key, list.items[0]);
        return list.items[0];
      }
      generationInfos.delete(key); // not committed (yet: an open generation may be committed later)
      return null;
    });
    asked.catch(() => generationInfos.delete(key)); // asked again next time
    generationInfos.set(key, asked);
  }
  return generationInfos.get(key);
}

// A generation id with its commit time next to it (filled in when the row scrolls into view), the id and
// the full time on hover. `name` is the collection the generation belongs to (null: a stream position).
function genHtml(name, es) {
  if (es === null || es === undefined || name === null) return labelHtml(es);
  const attributes = `class="when" data-c="${esc(name)}" data-g="${esc(JSON.stringify(es))}"`;
  const known = generationsKnown.get(`${name}\n${hex(esToBytes(es))}`);
  if (known && known.committedAtMs !== null) {
    const at = new Date(known.committedAtMs);
    return `<span class="gen">${labelHtml(es)} <time ${attributes} data-filled data-ms="${known.committedAtMs}" datetime="${at.toISOString()}"
      title="generation ${esc(idLabel(es))} committed ${esc(at.toLocaleString())} (${at.toISOString()})">${esc(whenText(known.committedAtMs))}</time></span>`;
  }
  return `<span class="gen">${labelHtml(es)} <time ${attributes}></time></span>`;
}

function showWhen(element, info) {
  const id = idLabel(JSON.parse(element.dataset.g));
  element.dataset.filled = "";
  performance.mark("diffstore:time-filled"); // benchmarks/console_first_page.py reads them
  if (info === null) {
    element.textContent = "";
    return;
  }
  if (info.committedAtMs === null && esToBytes(JSON.parse(element.dataset.g)).length === 0) {
    element.textContent = "the start";
    element.title = "the empty generation every collection starts at";
    return;
  }
  if (info.committedAtMs === null) {
    element.textContent = "time unknown";
    element.title = `generation ${id}: committed before diffstore recorded commit times`;
    return;
  }
  element.dateTime = new Date(info.committedAtMs).toISOString();
  element.dataset.ms = String(info.committedAtMs);
  element.textContent = whenText(info.committedAtMs);
  element.title = `generation ${id} committed ${new Date(info.committedAtMs).toLocaleString()} (${element.dateTime})`;
}

// Observes the id's box (an empty <time> has none, so it would never be seen).
const timeObserver = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    timeObserver.unobserve(entry.target);
    const element = entry.target.querySelector("time.when");
    generationInfo(element.dataset.c, JSON.parse(element.dataset.g))
      .then((info) => showWhen(element, info))
      .catch(() => { element.textContent = ""; });
  }
});

// Fills the commit times of the ids drawn under `root` (only those on screen ask the server).
function fillTimes(root) {
  const found = root.querySelectorAll("time.when:not([data-filled])");
  for (const element of root.matches("time.when:not([data-filled])") ? [root] : found) {
    timeObserver.observe(element.parentElement);
  }
}

// Relative times age while the page is open.
setInterval(() => {
  for (const element of document.querySelectorAll("time.when[data-ms], time.at[data-ms]")) {
    element.textContent = whenText(Number(element.dataset.ms));
  }
}, 15000);

// ---- generations typed or in the address ----------------------------------------------------------

// The generation a text names in collection `name`: a ref (`@current`, `@open`, `~N`, `@reader:NAME`,
// `@reader:OWNER/NAME`, an ISO time `@2026-11-25T10:00:00Z`; GET /collections/{c}/refs resolves them) or
// a generation in the command line's text form, which must be a committed generation or the open one.
// An unknown one is an error, never a silent read of another generation (an id between two committed
// ones reads as the older one in the API; the console refuses it, as `diffstore query` does).
async function resolveGeneration(name, text, signal) {
  if (REF.test(text)) {
    const answer = await api("GET", `${collectionPath(name)}/refs?${new URLSearchParams({ ref: text })}`, undefined, signal);
    return answer.generationId;
  }
  const es = parseLabel(text);
  const [info, collection] = await Promise.all([
    generationInfo(name, es),
    api("GET", collectionPath(name), undefined, signal),
  ]);
  if (info !== null || sameEs(es, collection.nextGenerationId)) return es;
  if (esToBytes(es).length === 0) return es; // "": the empty generation every collection starts at
  throw new Error(`${name} has no generation ${JSON.stringify(text)} (neither committed nor open)`);
}

// An error of the view's own request (a generation that does not exist, a collected one): said on the
// page, in place of the rows, which would otherwise be those of another read.
function pageProblem(error) {
  if (error && error.name === "AbortError") return;
  showError(error);
  const box = document.getElementById("problem");
  if (!box) return;
  box.textContent = String(error && error.message ? error.message : error);
  box.hidden = false;
  for (const id of ["records", "diff", "history"]) {
    const body = document.querySelector(`#${id} tbody`);
    if (body) body.innerHTML = "";
  }
  const lineage = document.getElementById("lineage");
  if (lineage) lineage.innerHTML = "";
}

function clearProblem() {
  const box = document.getElementById("problem");
  if (box) box.hidden = true;
}

// ---- Collections -----------------------------------------------------------------------------------

function readerHtml(owner, r) {
  const seen = state.readerSeen.get(`${owner}/${r.readerName}`);
  const moved = seen && seen.movedAt ? `moved ${ago(seen.movedAt)}` : "";
  const lag =
    r.lagGenerations === null
      ? '<span class="muted">(stream)</span>'
      : `<span class="${r.lagGenerations === 0 ? "lag0" : "lagN"}" title="committed generations of ${esc(r.target)} after the reader's">lag ${r.lagGenerations}</span>`;
  const diff = r.targetIsCollection
    ? ` <a href="#/diff/${encodeURIComponent(r.target)}?reader=${encodeURIComponent(r.readerName)}&in=${encodeURIComponent(owner)}" title="what the reader has not read yet">diff</a>`
    : "";
  return `<div class="reader" data-reader="${esc(r.readerName)}"><b>${esc(r.readerName)}</b> ← ${esc(r.target)} @ ${genHtml(r.targetIsCollection ? r.target : null, r.generationId)} ${lag} <span class="muted">${moved}</span>${diff}</div>`;
}

function collectionRows(collections) {
  return collections
    .map((c) => {
      const href = encodeURIComponent(c.name);
      return `<tr data-name="${esc(c.name)}"><td><a href="#/browse/${href}">${esc(c.name)}</a></td>
<td>${c.isManual ? '<span class="tag">manual</span>' : '<span class="tag auto">auto</span>'}</td>
<td class="generation">${genHtml(c.name, c.generationId)}</td><td class="next">${labelHtml(c.nextGenerationId)}</td>
<td>${c.readers.map((r) => readerHtml(c.name, r)).join("")}</td>
<td><a href="#/history/${href}">history</a> <a href="#/diff/${href}">diff</a> <a href="#/lineage/${href}">lineage</a></td></tr>`;
    })
    .join("");
}

async function viewCollections(signal) {
  main().innerHTML = `<h2>Collections <span id="count" class="muted"></span></h2>
<p id="replica" hidden></p>
<p id="ha" hidden></p>
<div class="toolbar"><label>Filter<input id="filter" placeholder="name contains" autocomplete="off"></label>
<span class="muted">Reader lag counts the committed generations of the target after the reader's generation.
“Moved” is when this page saw a reader move (the store does not record when readers move).</span></div>
<table id="collections"><thead><tr><th>Collection</th><th>Kind</th><th>Generation</th><th>Next generation</th>
<th>Readers</th><th></th></tr></thead><tbody></tbody></table>`;
  const filter = document.getElementById("filter");
  const applyFilter = () => {
    const text = filter.value.toLowerCase();
    for (const row of document.querySelectorAll("#collections tbody tr")) {
      row.hidden = Boolean(text) && !row.dataset.name.toLowerCase().includes(text);
    }
  };
  filter.addEventListener("input", applyFilter);
  const draw = (overview) => {
    const size = (overview.storeFileBytes / 1048576).toFixed(1);
    const free = ((overview.storeFreePages * overview.storePageBytes) / 1048576).toFixed(1);
    document.getElementById("count").textContent =
      `${overview.collections.length} · store ${size} MiB (${free} MiB free)`;
    const replica = document.getElementById("replica");
    replica.hidden = !overview.replica;
    if (overview.replica) {
      // a read replica (docs/replicas.md): writes go to its primary; how far behind each collection is
      const behind = overview.replica.collections.filter((c) => c.lagGenerations > 0)
        .map((c) => `${esc(c.collectionName)}: ${c.lagGenerations} generations (${c.lagSeconds.toFixed(1)} s)`);
      // each collection's follower: copying, following or stalled (with why and since when)
      const since = (c) => (c.sinceMs ? ` since ${new Date(c.sinceMs).toISOString().slice(11, 19)}` : "");
      const stalled = overview.replica.collections.filter((c) => c.state === "stalled")
        .map((c) => `<span class="replica-stalled">${esc(c.collectionName)} stalled${since(c)}: ` +
          `${esc(c.reason || "")}</span>`);
      const copying = overview.replica.collections.filter((c) => c.state === "copying")
        .map((c) => `${esc(c.collectionName)}${since(c)}`);
      replica.innerHTML = `Read replica of <b>${esc(overview.replica.primary)}</b> (read-only) · ` +
        (behind.length ? `behind: ${behind.join(", ")}` : "caught up") +
        (copying.length ? ` · copying: ${copying.join(", ")}` : "") +
        (stalled.length ? ` · ${stalled.join(" · ")}` : "");
    }
    const ha = document.getElementById("ha");
    ha.hidden = !overview.ha;
    if (overview.ha) {
      // a fail-over member (docs/failover.md): its role, the leader it knows, the term
      const h = overview.ha;
      const leader = h.leader ? `${esc(h.leader.member || "")} (${esc(h.leader.url)})` : "none known";
      ha.innerHTML = `Fail-over cluster <b>${esc(h.cluster)}</b>: member <b>${esc(h.member)}</b> is ` +
        `<b>${esc(h.role)}</b> · leader ${leader} · term ${h.term}`;
    }
    const tbody = document.querySelector("#collections tbody");
    if (!overview.collections.length) {
      tbody.innerHTML = `<tr class="empty"><td colspan="6" class="muted">No collections yet. Create one from a shell:
<code>diffstore collections create orders --manual</code> (or <code>--auto</code>), or with <code>POST /collections/</code>;
it shows here at once (every route: <a href="/docs">the API reference</a>).</td></tr>`;
      return;
    }
    // a screenful at once, the rest right after: the first page shows before thousands of rows are laid out
    tbody.innerHTML = collectionRows(overview.collections.slice(0, FIRST_ROWS));
    applyFilter();
    if (overview.collections.length > FIRST_ROWS) {
      // the rest in tasks of ROWS_PER_TASK rows, so the page stays responsive
      const more = (from) => {
        if (signal.aborted || !tbody.isConnected) return;
        const part = overview.collections.slice(from, from + ROWS_PER_TASK);
        tbody.insertAdjacentHTML("beforeend", collectionRows(part));
        applyFilter();
        if (from + ROWS_PER_TASK < overview.collections.length) setTimeout(() => more(from + ROWS_PER_TASK), 0);
      };
      // the first screen's commit times first (at most a second): laying out thousands of rows holds the
      // page's one thread for a while under load, and the answers would wait behind it
      requestAnimationFrame(() => {
        const first = overview.collections.slice(0, FIRST_TIMES).map((c) => generationInfo(c.name, c.generationId).catch(() => null));
        Promise.race([Promise.all(first), sleep(1000, signal)]).then(() => setTimeout(() => more(FIRST_ROWS), 0));
      });
    }
  };
  draw(await loadOverview(signal));
  performance.mark("diffstore:collections-drawn"); // benchmarks/console_first_page.py reads it
  followOverview(signal, async () => draw(await loadOverview(signal)));
}

// ---- Pipeline graph --------------------------------------------------------------------------------

// layoutGraph and graphSvg: graph.js

async function viewGraph(signal) {
  main().innerHTML = `<h2>Pipeline</h2><p class="muted">An arrow A → C: a reader of C follows A (C is computed from A),
labelled with the reader's name and lag. Dashed boxes are stream sources (readers whose target is not a collection,
such as <code>hstream://…</code>); a loop is a collection that reads itself. Orange arrows: the reader is behind.
A collection's box opens it in Browse.</p>
<div id="graph" aria-busy="true"><p class="muted loading">Loading the pipeline…</p></div><p id="isolated" class="muted"></p>`;
  const draw = (overview) => {
    const box = document.getElementById("graph");
    const g = layoutGraph(overview);
    box.setAttribute("aria-busy", "false");
    if (!overview.collections.length) {
      box.innerHTML = '<p class="muted empty">No collections yet: create one (<code>diffstore collections create</code>) and it shows here.</p>';
    } else if (!g.edges.length) {
      box.innerHTML = '<p class="muted empty">No readers yet: no collection reads another or a stream, so there is no pipeline to draw.</p>';
    } else {
      box.innerHTML = graphSvg(g);
    }
    const shown = g.isolated.slice(0, 50).map(esc).join(", ");
    document.getElementById("isolated").innerHTML = g.isolated.length
      ? `Not in any pipeline (${g.isolated.length}): ${shown}${g.isolated.length > 50 ? ", …" : ""}`
      : "";
  };
  draw(await loadOverview(signal));
  followOverview(signal, async () => draw(await loadOverview(signal)));
}

// ---- shared pieces of Browse and Diff --------------------------------------------------------------

async function pickCollection(signal, route) {
  const list = await api("GET", "/collections/", undefined, signal);
  const items = list.items.map((c) => `<li><a href="#/${route}/${encodeURIComponent(c.name)}">${esc(c.name)}</a></li>`);
  const title = { browse: "Browse", diff: "Diff", lineage: "Lineage", history: "History" }[route];
  main().innerHTML = `<h2>${title}: pick a collection</h2><ul>${items.join("") || '<li class="muted">no collections</li>'}</ul>`;
}

async function generationOptions(signal, name) {
  try {
    const list = await api("GET", `${collectionPath(name)}/generations?limit=200`, undefined, signal);
    rememberGenerations(name, list.items);
    const when = (g) => (g.committedAtMs === null ? "" : ` label="${esc(whenText(g.committedAtMs))}"`);
    return list.items.map((g) => `<option value="${esc(idLabel(g.generationId))}"${when(g)}>`).join("");
  } catch (error) {
    showError(error);
    return "";
  }
}

// The field's list of recent generations; the view may be gone by the time they arrive.
function fillGenerationList(signal, name) {
  generationOptions(signal, name).then((html) => {
    const list = document.getElementById("generations");
    if (list && !signal.aborted) list.innerHTML = html;
  });
}

function banner(text) {
  const box = document.getElementById("banner");
  if (!box) return;
  box.textContent = text;
  box.hidden = false;
  box.classList.remove("flash");
  void box.offsetWidth; // restart the animation
  box.classList.add("flash");
}

// The view and collection the address names (what render() draws).
function currentRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?");
  const [route, ...rest] = path.split("/");
  const name = rest.length ? decodeURIComponent(rest.join("/")) : "";
  return { view: route || "collections", name, params: new URLSearchParams(query || "") };
}

function setHashQuery(route, name, params) {
  // The address moved on to another view whose hashchange is not handled yet (the user left this one as
  // its answer arrived): writing this view's address back would undo the user's navigation.
  const current = currentRoute();
  if (current.view !== route || current.name !== name) return;
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v));
  const text = query.toString();
  history.replaceState(null, "", `#/${route}/${encodeURIComponent(name)}${text ? "?" + text : ""}`);
}

// ---- Browse ----------------------------------------------------------------------------------------

async function viewBrowse(signal, name, params) {
  if (!name) return pickCollection(signal, "browse");
  const collection = await api("GET", collectionPath(name), undefined, signal);
  main().innerHTML = `<h2>Browse <code>${esc(name)}</code> <span class="tag${collection.isManual ? "" : " auto"}">${collection.isManual ? "manual" : "auto"}</span></h2>
<form class="toolbar" id="browse-form">
<label>As of generation <input id="generation" list="generations" placeholder="current" title="a generation id, or a ref: @current, @open, ~N (N commits back), @reader:NAME, @2026-11-25T10:00:00Z" value="${esc(params.get("g") || "")}"></label>
<datalist id="generations"></datalist>
<label>Phantom id <input id="phantom" placeholder="none" value="${esc(params.get("p") || "")}"></label>
<label>Jump to key <input id="jump" placeholder="key or base64:…" value="${esc(params.get("k") || "")}"></label>
<label>Page size <select id="limit"><option>50</option><option selected>100</option><option>500</option></select></label>
<button type="submit">Show</button>
<a href="#/diff/${encodeURIComponent(name)}">diff this collection</a></form>
<p id="banner" class="banner" hidden></p><p id="problem" class="error" role="alert" hidden></p>
<p id="around" class="muted"></p><p id="asof" class="muted"></p>
<table id="records"><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody></tbody></table>
<div class="pager"><button type="button" class="secondary" id="prev">Previous</button><button type="button" class="secondary" id="next">Next</button><span id="page" class="muted"></span></div>`;
  fillGenerationList(signal, name);
  const form = document.getElementById("browse-form");
  let starts = []; // fromKey (ES or null) of every page before the current one
  let start = null; // fromKey of the current page
  let pinned = null; // the generation the pages are read at (the answer of the first page)
  let found = null; // the key jumped to, highlighted
  let cursorMore = false;
  let last = null;

  const common = () => {
    const body = {};
    const p = document.getElementById("phantom").value.trim();
    if (pinned) body.generationId = pinned;
    if (p) body.phantomId = parseLabel(p);
    return body;
  };

  const load = async () => {
    const limit = Number(document.getElementById("limit").value);
    const body = { ...common(), limit };
    if (start) body.fromKey = start;
    const page = await api("POST", `${collectionPath(name)}/query/`, body, signal);
    pinned = page.generationId;
    cursorMore = Boolean(page.cursorId);
    last = page.items.length ? page.items[page.items.length - 1].key : null;
    const foundHex = found ? hex(esToBytes(found)) : null;
    document.querySelector("#records tbody").innerHTML =
      page.items
        .map((item) => {
          const mark = foundHex !== null && hex(esToBytes(item.key)) === foundHex ? ' class="found"' : "";
          return `<tr${mark}><td>${valueHtml(item.key)}</td><td>${valueHtml(item.value)}</td></tr>`;
        })
        .join("") || '<tr><td colspan="2" class="muted">no records</td></tr>';
    document.getElementById("asof").innerHTML = `As of generation ${genHtml(name, page.generationId)} · ${page.items.length} records on this page`;
    document.getElementById("page").textContent = `page ${starts.length + 1}`;
    document.getElementById("prev").disabled = starts.length === 0;
    document.getElementById("next").disabled = !cursorMore;
  };

  const jump = async (label) => {
    const key = parseLabel(label);
    const around = await api("POST", `${collectionPath(name)}/getKeysAround`, { ...common(), key, requireKeyExistance: false, limit: 5 }, signal);
    pinned = around.generationId;
    found = key;
    document.getElementById("around").innerHTML = around.foundKey
      ? `Key ${valueHtml(key)} found (highlighted), shown with the ${around.left.length} keys before it.`
      : `Key ${valueHtml(key)} is not there; the page starts at the keys around where it would be.`;
    starts = [];
    start = around.left.length ? around.left[around.left.length - 1] : key;
  };

  const show = async () => {
    const g = document.getElementById("generation").value.trim();
    const k = document.getElementById("jump").value.trim();
    setHashQuery("browse", name, { g, p: document.getElementById("phantom").value.trim(), k });
    pinned = null;
    found = null;
    starts = [];
    start = null;
    document.getElementById("around").textContent = "";
    clearProblem();
    if (g) pinned = await resolveGeneration(name, g, signal);
    if (k) await jump(k);
    await load();
  };

  form.addEventListener("submit", (event) => { event.preventDefault(); show().catch(pageProblem); });
  document.getElementById("next").addEventListener("click", () => {
    if (!last) return;
    starts.push(start);
    const bytes = esToBytes(last);
    const next = new Uint8Array(bytes.length + 1); // the smallest key after the page's last
    next.set(bytes);
    start = bytesToEs(next);
    load().catch(showError);
  });
  document.getElementById("prev").addEventListener("click", () => {
    start = starts.pop() || null;
    load().catch(showError);
  });
  await show().catch(pageProblem);
  // Live: a page read at the current generation follows the commits.
  follow(signal, name, collection.generationId, async (generation) => {
    if (document.getElementById("generation").value.trim()) return; // pinned by the user
    pinned = null;
    await load();
    banner(`Generation ${idLabel(generation)} committed: page updated at ${new Date().toLocaleTimeString()}`);
  });
}

// ---- Diff ------------------------------------------------------------------------------------------

// A diff item's kind, its marker and words: the marker and the words say it, the colour only repeats it.
const KINDS = {
  inserted: { mark: "+", row: "added", words: "inserted (no value before)" },
  updated: { mark: "~", row: "changed", words: "updated" },
  deleted: { mark: "−", row: "removed", words: "deleted (no value after)" },
};
const kindOf = (item) => (item.fromValue === null ? "inserted" : item.toValue === null ? "deleted" : "updated");
const COUNT_MAX = 100_000; // the totals stop counting here ("at least")

// A value that is a JSON object or array (as UTF-8 text), else undefined: only those get a field diff.
function jsonOf(es) {
  const bytes = esToBytes(es);
  const text = bytes === null ? null : asText(bytes);
  if (text === null || !/^\s*[[{]/.test(text)) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

const isContainer = (v) => v !== null && typeof v === "object";
const pathText = (path) =>
  path.map((p, i) => (typeof p === "number" ? `[${p}]` : /^[A-Za-z_$][\w$]*$/.test(p) ? (i ? "." : "") + p : `[${JSON.stringify(p)}]`)).join("");

// The fields that differ between two JSON values: [{path, kind: "added"|"removed"|"changed", from, to}],
// down to the smallest part that changed (a scalar, or a field only one side has).
function jsonChanges(a, b, path = [], out = []) {
  if (isContainer(a) && isContainer(b) && Array.isArray(a) === Array.isArray(b)) {
    const keys = Array.isArray(a)
      ? Array.from({ length: Math.max(a.length, b.length) }, (_, i) => i)
      : [...Object.keys(a), ...Object.keys(b).filter((k) => !Object.hasOwn(a, k))];
    for (const k of keys) {
      const inA = Array.isArray(a) ? k < a.length : Object.hasOwn(a, k);
      const inB = Array.isArray(b) ? k < b.length : Object.hasOwn(b, k);
      if (!inA) out.push({ path: [...path, k], kind: "added", to: b[k] });
      else if (!inB) out.push({ path: [...path, k], kind: "removed", from: a[k] });
      else jsonChanges(a[k], b[k], [...path, k], out);
    }
  } else if (JSON.stringify(a) !== JSON.stringify(b)) {
    out.push({ path, kind: "changed", from: a, to: b });
  }
  return out;
}

// A JSON value as compact text, the fields of `marked` (path text -> kind) wrapped in <mark>.
function jsonHtml(value, marked, path = []) {
  const wrap = (p, html) => {
    const kind = marked.get(pathText(p));
    return kind ? `<mark class="field ${kind}" data-path="${esc(pathText(p))}" title="${kind}: ${esc(pathText(p))}">${html}</mark>` : html;
  };
  if (!isContainer(value)) return esc(JSON.stringify(value));
  if (Array.isArray(value)) {
    return `[${value.map((v, i) => wrap([...path, i], jsonHtml(v, marked, [...path, i]))).join(", ")}]`;
  }
  const fields = Object.entries(value).map(([k, v]) =>
    wrap([...path, k], `${esc(JSON.stringify(k))}: ${jsonHtml(v, marked, [...path, k])}`));
  return `{${fields.join(", ")}}`;
}

// The from and to cells of an updated JSON value, with what changed field by field; null when the values
// are not both JSON objects or arrays.
function jsonDiffHtml(item) {
  const a = jsonOf(item.fromValue), b = jsonOf(item.toValue);
  if (a === undefined || b === undefined || !isContainer(a) || !isContainer(b)) return null;
  const changes = jsonChanges(a, b);
  const side = (which) => new Map(changes.filter((c) => c.kind === "changed" || c.kind === which).map((c) => [pathText(c.path), c.kind]));
  const list = changes.map((c) => {
    const what = c.kind === "changed" ? `${esc(JSON.stringify(c.from))} → ${esc(JSON.stringify(c.to))}`
      : esc(JSON.stringify(c.kind === "added" ? c.to : c.from));
    const mark = { changed: "~", added: "+", removed: "−" }[c.kind];
    return `<li data-path="${esc(pathText(c.path))}"><span class="mark" aria-hidden="true">${mark}</span> <code>${esc(pathText(c.path) || "(the whole value)")}</code> ${c.kind}: ${what}</li>`;
  });
  const summary = changes.length
    ? `<ul class="fields" aria-label="fields that changed">${list.join("")}</ul>`
    : '<p class="fields muted">the same JSON, written differently</p>';
  return {
    from: `<span class="value json">${jsonHtml(a, side("removed"))}</span>`,
    to: `<span class="value json">${jsonHtml(b, side("added"))}</span>${summary}`,
  };
}

function totalsHtml(counts, done, parts) {
  const word = done ? "" : counts.total >= COUNT_MAX ? " at least" : " so far, counting…";
  const items = Object.entries(KINDS).map(([kind, k]) =>
    `<span class="total ${k.row}" data-kind="${kind}"><span class="mark" aria-hidden="true">${k.mark}</span> <b>${counts[kind]}</b> ${kind}</span>`);
  const split = parts > 1 ? ` <span class="muted">(summed over ${parts} parts of the range: a key changed in two parts counts twice)</span>` : "";
  return `Totals${word}: ${items.join(" ")} · <b>${counts.total}</b> keys${split}`;
}


async function viewDiff(signal, name, params) {
  if (!name) return pickCollection(signal, "diff");
  const [collection, overview] = await Promise.all([
    api("GET", collectionPath(name), undefined, signal),
    loadOverview(signal),
  ]);
  const readers = [];
  for (const c of overview.collections) {
    for (const r of c.readers) if (r.target === name) readers.push({ owner: c.name, reader: r.readerName });
  }
  const readerOptions = readers
    .map(({ owner, reader }) => {
      const selected = params.get("reader") === reader && (params.get("in") || name) === owner ? " selected" : "";
      return `<option value="${esc(JSON.stringify([owner, reader]))}"${selected}>${esc(reader)} (in ${esc(owner)})</option>`;
    })
    .join("");
  main().innerHTML = `<h2>Diff <code>${esc(name)}</code></h2>
<form class="toolbar" id="diff-form">
<label>From reader <select id="reader"><option value="">— a generation —</option>${readerOptions}</select></label>
<label>From generation <input id="from" list="generations" title="a generation id, or a ref: @current, @open, ~N (N commits back), @reader:NAME, @2026-11-25T10:00:00Z" placeholder='"" = the beginning' value="${esc(params.get("from") || "")}"></label>
<label>To generation <input id="to" list="generations" title="a generation id, or a ref: @current, @open, ~N (N commits back), @reader:NAME, @2026-11-25T10:00:00Z" placeholder="current" value="${esc(params.get("to") || "")}"></label>
<datalist id="generations"></datalist>
<label>Page size <select id="limit"><option>100</option><option selected>200</option><option>1000</option></select></label>
<button type="submit">Diff</button>
<label>Show <select id="kind">${[["", "every change"], ...Object.keys(KINDS).map((k) => [k, `${KINDS[k].mark} ${k} only`])]
    .map(([v, t]) => `<option value="${v}"${params.get("kind") === v ? " selected" : ""}>${esc(t)}</option>`).join("")}</select></label>
<a href="#/browse/${encodeURIComponent(name)}">browse</a> <a href="#/history/${encodeURIComponent(name)}">history</a></form>
<p id="banner" class="banner" hidden></p><p id="problem" class="error" role="alert" hidden></p><p id="range" class="muted"></p>
<p id="totals" aria-live="polite"></p>
<p id="legend" class="muted">Legend: ${Object.values(KINDS).map((k) => `<span class="total ${k.row}"><span class="mark" aria-hidden="true">${k.mark}</span> ${k.words}</span>`).join(" ")};
in a JSON object or array, <mark class="field changed">the fields that changed</mark> are marked and listed under the new value.
<span id="between-help"><b>between</b> shows the values a key had in the generations strictly between From and To, oldest first
(a key written several times in the range; the diff itself compares only its two ends).</span></p>
<table id="diff"><thead><tr><th class="mark"><span class="visually-hidden">Change</span></th><th>Key</th><th>From</th><th>To</th><th></th></tr></thead><tbody></tbody></table>
<div class="pager"><button type="button" class="secondary" id="prev">Previous</button><button type="button" class="secondary" id="next">Next</button><span id="page" class="muted"></span></div>`;
  fillGenerationList(signal, name);
  let pages = []; // how to read each page again: {cursor} or {body}
  let index = -1;
  let current = null; // the page shown
  let wantedTo = null; // the "to" asked for (null: the current generation when the diff started)
  let seen = 0;

  // From "" is the beginning (the empty generation), To "" the current generation.
  const firstBody = async () => {
    const limit = Number(document.getElementById("limit").value);
    const body = { limit };
    const choice = document.getElementById("reader").value;
    const from = document.getElementById("from").value.trim();
    const to = document.getElementById("to").value.trim();
    if (choice) {
      const [owner, reader] = JSON.parse(choice);
      body.fromReader = { readerName: reader, collectionName: owner };
    } else {
      body.fromGenerationId = from ? await resolveGeneration(name, from, signal) : { value: "" };
    }
    if (to) body.toGenerationId = await resolveGeneration(name, to, signal);
    return body;
  };

  const fetchPage = (how) =>
    how.cursor
      ? api("GET", `${collectionPath(name)}/diff/${how.cursor}`, undefined, signal)
      : api("POST", `${collectionPath(name)}/diff/`, how.body, signal);

  // The kind filter hides the other rows of the page shown (pages are the server's: see docs/console.md).
  const applyKind = () => {
    const kind = document.getElementById("kind").value;
    const rows = document.querySelectorAll("#diff tbody tr[data-kind]");
    let shown = 0;
    for (const row of rows) {
      row.hidden = Boolean(kind) && row.dataset.kind !== kind;
      const extra = row.nextElementSibling;
      if (extra && extra.classList.contains("between-values")) extra.hidden = row.hidden;
      if (!row.hidden) shown++;
    }
    const note = document.getElementById("filtered");
    if (note) note.textContent = kind ? ` · ${shown} of ${rows.length} ${kind}` : "";
    const none = document.getElementById("none-of-kind");
    if (none) none.remove();
    if (kind && rows.length && !shown) {
      const more = !document.getElementById("next").disabled;
      document.querySelector("#diff tbody").insertAdjacentHTML("beforeend",
        `<tr id="none-of-kind"><td colspan="5" class="muted">No ${kind} key on this page${more ? ": the next page may have some" : ""}.</td></tr>`);
    }
  };

  const render = (page) => {
    current = page;
    const rows = page.items.map((item, i) => {
      const kind = kindOf(item);
      const k = KINDS[kind];
      const json = kind === "updated" ? jsonDiffHtml(item) : null;
      const from = json ? json.from : valueHtml(item.fromValue);
      const to = json ? json.to : valueHtml(item.toValue);
      return `<tr class="${k.row}" data-kind="${kind}" data-key="${esc(textForm(item.key))}" data-i="${i}"><td class="mark" title="${kind}"><span aria-hidden="true">${k.mark}</span><span class="visually-hidden">${kind}</span></td><td class="key">${valueHtml(item.key)}</td><td class="from">${from}</td><td class="to">${to}</td><td><button type="button" class="secondary between" data-i="${i}" title="the values this key had in the generations strictly between From and To, oldest first">between</button></td></tr>`;
    });
    const tbody = document.querySelector("#diff tbody");
    tbody.innerHTML = rows.join("") || '<tr><td colspan="5" class="muted">no changes in this range</td></tr>';
    document.getElementById("range").innerHTML = `Changes after ${genHtml(name, page.fromGenerationId)} up to ${genHtml(name, page.toGenerationId)} · ${page.items.length} on this page<span id="filtered"></span>`;
    document.getElementById("page").textContent = `page ${index + 1} · ${seen} items so far`;
    document.getElementById("prev").disabled = index <= 0;
    document.getElementById("next").disabled = !nextHow(page);
    applyKind();
  };

  // The next page: the cursor, or, when the server cut a long range short, the rest of the range.
  const nextHow = (page) => {
    if (page.cursorId) return { cursor: page.cursorId };
    if (wantedTo && !sameEs(page.toGenerationId, wantedTo)) {
      const body = { ...pages[0].body, fromGenerationId: page.toGenerationId };
      delete body.fromReader;
      return { body };
    }
    return null;
  };

  const go = async (i, how) => {
    const page = await fetchPage(how);
    if (i === pages.length) {
      pages.push(how);
      seen += page.items.length;
    }
    index = i;
    if (i === 0 && !wantedTo) wantedTo = page.toGenerationId;
    render(page);
  };

  // live: a commit runs the diff again with the body the user last asked for, its "from" as resolved then
  // (a ref such as @current names the generation current when the view opened, not each new one); only
  // "to" follows the commits
  const run = async (live = false) => {
    const choice = document.getElementById("reader").value;
    const [owner, reader] = choice ? JSON.parse(choice) : [null, null];
    setHashQuery("diff", name, {
      reader,
      in: owner,
      from: choice ? "" : document.getElementById("from").value.trim(),
      to: document.getElementById("to").value.trim(),
      kind: document.getElementById("kind").value,
    });
    clearProblem();
    let body;
    if (live && pages.length) {
      body = { ...pages[0].body };
      delete body.toGenerationId;
    } else {
      body = await firstBody();
    }
    wantedTo = body.toGenerationId || null;
    pages = [];
    seen = 0;
    await go(0, { body });
    countTotals(body).catch(pageProblem);
  };

  // The totals of the whole range: its pages read again in the background, 1,000 at a time (a new diff
  // or leaving the view stops it; past COUNT_MAX keys it stops and says "at least").
  let counting = null;
  const countTotals = async (body) => {
    if (counting) counting.abort();
    const mine = new AbortController();
    counting = mine;
    signal.addEventListener("abort", () => mine.abort(), { once: true });
    const counts = { inserted: 0, updated: 0, deleted: 0, total: 0 };
    const box = document.getElementById("totals");
    let parts = 1;
    let how = { body: { ...body, limit: 1000 } };
    const end = wantedTo;
    box.innerHTML = totalsHtml(counts, false, parts);
    while (how && counts.total < COUNT_MAX) {
      const page = how.cursor
        ? await api("GET", `${collectionPath(name)}/diff/${how.cursor}`, undefined, mine.signal)
        : await api("POST", `${collectionPath(name)}/diff/`, how.body, mine.signal);
      if (mine.signal.aborted) return;
      for (const item of page.items) counts[kindOf(item)]++;
      counts.total += page.items.length;
      if (page.cursorId) how = { cursor: page.cursorId };
      else if (end && !sameEs(page.toGenerationId, end)) {
        parts++;
        how = { body: { ...how.body || body, limit: 1000, fromGenerationId: page.toGenerationId } };
        delete how.body.fromReader;
      } else how = null;
      box.innerHTML = totalsHtml(counts, how === null, parts);
    }
  };

  document.getElementById("diff-form").addEventListener("submit", (event) => { event.preventDefault(); run().catch(pageProblem); });
  document.getElementById("kind").addEventListener("change", () => {
    const query = new URLSearchParams(location.hash.split("?")[1] || "");
    const kind = document.getElementById("kind").value;
    if (kind) query.set("kind", kind); else query.delete("kind");
    history.replaceState(null, "", `#/diff/${encodeURIComponent(name)}?${query}`);
    applyKind();
  });
  document.getElementById("next").addEventListener("click", () => {
    const how = index + 1 < pages.length ? pages[index + 1] : nextHow(current);
    if (how) go(index + 1, how).catch(showError);
  });
  document.getElementById("prev").addEventListener("click", () => { if (index > 0) go(index - 1, pages[index - 1]).catch(showError); });
  document.querySelector("#diff tbody").addEventListener("click", async (event) => {
    const button = event.target.closest("button.between");
    if (!button) return;
    const item = current.items[Number(button.dataset.i)];
    const key = esToBytes(item.key);
    const after = new Uint8Array(key.length + 1);
    after.set(key);
    try {
      const page = await api("POST", `${collectionPath(name)}/diff/`, {
        fromGenerationId: current.fromGenerationId,
        toGenerationId: current.toGenerationId,
        omitIntermediateValues: false,
        fromKey: item.key,
        toKey: bytesToEs(after),
        limit: 1,
      }, signal);
      const values = page.items.length ? page.items[0].intermediateValues : [];
      const row = button.closest("tr");
      const extra = document.createElement("tr");
      extra.className = "between-values";
      extra.innerHTML = `<td></td><td></td><td colspan="3">${values.length ? "In between, oldest first: " + values.map(valueHtml).join(" → ") : '<span class="muted">no values in between</span>'}</td>`;
      row.after(extra);
      button.disabled = true;
    } catch (error) {
      showError(error);
    }
  });
  await run().catch(pageProblem);
  // Live: a diff up to the current generation follows the commits (on its first page; else a notice).
  follow(signal, name, collection.generationId, async (generation) => {
    if (document.getElementById("to").value.trim()) return;
    if (index <= 0) {
      await run(true);
      banner(`Generation ${idLabel(generation)} committed: diff updated at ${new Date().toLocaleTimeString()}`);
    } else {
      banner(`Generation ${idLabel(generation)} committed: press Diff to see it`);
    }
  });
}

// ---- History ---------------------------------------------------------------------------------------

function metadataHtml(metadata) {
  if (!metadata) return "";
  return Object.entries(metadata)
    .map(([k, v]) => `<span class="meta"><b>${esc(k)}</b>=${esc(v)}</span>`)
    .join(" ");
}

// The log of a collection (GET /collections/{c}/generations), newest first, a page at a time: each commit
// with its local and relative time, the keys it changed, its metadata, and links to its diff against the
// generation before it and to its lineage.
async function viewHistory(signal, name, params) {
  if (!name) return pickCollection(signal, "history");
  const collection = await api("GET", collectionPath(name), undefined, signal);
  const limit = Math.min(1000, Math.max(1, Number(params.get("limit")) || 50));
  main().innerHTML = `<h2>History of <code>${esc(name)}</code> <span class="tag${collection.isManual ? "" : " auto"}">${collection.isManual ? "manual" : "auto"}</span></h2>
<form class="toolbar" id="history-form">
<label>Older than generation <input id="before" list="generations" title="a generation id, or a ref: @current, @open, ~N (N commits back), @reader:NAME, @2026-11-25T10:00:00Z" placeholder="the newest" value="${esc(params.get("before") || "")}"></label>
<datalist id="generations"></datalist>
<label>Page size <select id="limit">${[20, 50, 200].map((n) => `<option${n === limit ? " selected" : ""}>${n}</option>`).join("")}</select></label>
<button type="submit">Show</button>
<a href="#/browse/${encodeURIComponent(name)}">browse</a> <a href="#/lineage/${encodeURIComponent(name)}">lineage</a></form>
<p id="banner" class="banner" hidden></p><p id="problem" class="error" role="alert" hidden></p>
<p class="muted">Newest first. <b>Diff</b> shows what a commit changed (from the generation before it);
<b>lineage</b> which readers it moved. Times are this browser's local time; the server's clock stamped them.
Generations committed before diffstore recorded commit times show “time unknown”.</p>
<table id="history"><thead><tr><th>Generation</th><th>Committed</th><th class="num">Changed keys</th><th>Metadata</th><th></th></tr></thead><tbody></tbody></table>
<div class="pager"><button type="button" class="secondary" id="newer">Newer</button><button type="button" class="secondary" id="older">Older</button><span id="page" class="muted"></span></div>`;
  fillGenerationList(signal, name);
  let befores = []; // the `before` of every newer page (null: the newest)
  let before = null; // this page's (an EncodedString; null: from the current generation)
  let older = null; // the next page's

  const rowHtml = (item, previous) => {
    const id = idLabel(item.generationId);
    if (id === "") {
      return `<tr class="origin${item.collected ? " collected" : ""}" data-generation=""><td>${labelHtml(item.generationId)}</td>
<td colspan="4" class="muted">the empty generation the collection started at${item.collected ? " (collected)" : ""}</td></tr>`;
    }
    const href = encodeURIComponent(name);
    if (item.collected) {
      // GC collected it (docs/protocol.md, "Retention"): its reads, diff and lineage answer 410
      return `<tr class="collected" data-generation="${esc(id)}"><td title="generation ${esc(id)}, collected">${labelHtml(item.generationId)}
<span class="tag auto" title="garbage-collected: reads, diffs and lineage there answer 410">collected</span></td>
<td>${item.committedAtMs === null ? '<span class="muted">time unknown</span>' : `<time class="at" data-ms="${item.committedAtMs}">${esc(whenText(item.committedAtMs))}</time>`}</td>
<td class="num">${item.changedKeys === null ? '<span class="muted">?</span>' : item.changedKeys}</td><td>${metadataHtml(item.metadata)}</td><td></td></tr>`;
    }
    // the diff starts at the generation before: when that one was collected (and is not the beginning),
    // the diff would answer 410, so none is offered
    const previousGone = previous !== null && previous.collected && idLabel(previous.generationId) !== "";
    const diffQuery = new URLSearchParams({ from: previous === null ? "" : idLabel(previous.generationId), to: id });
    const when = item.committedAtMs === null
      ? '<span class="muted" title="committed before diffstore recorded commit times">time unknown</span>'
      : `<time class="at" datetime="${new Date(item.committedAtMs).toISOString()}" data-ms="${item.committedAtMs}"
          title="generation ${esc(id)} committed ${esc(new Date(item.committedAtMs).toLocaleString())}">${esc(whenText(item.committedAtMs))}</time>`;
    return `<tr data-generation="${esc(id)}"><td title="generation ${esc(id)}">${labelHtml(item.generationId)}</td><td>${when}</td>
<td class="num">${item.changedKeys === null ? '<span class="muted">?</span>' : item.changedKeys}</td><td>${metadataHtml(item.metadata)}</td>
<td>${previousGone ? '<span class="muted" title="the generation before it was collected">diff gone</span>' : `<a class="to-diff" href="#/diff/${href}?${diffQuery}" title="what generation ${esc(id)} changed">diff</a>`}
<a class="to-lineage" href="#/lineage/${href}?${new URLSearchParams({ g: id })}" title="the readers generation ${esc(id)} moved">lineage</a></td></tr>`;
  };

  const load = async () => {
    const size = Number(document.getElementById("limit").value);
    // one more than shown: the generation before the page's last row, which its diff starts from
    const query = new URLSearchParams({ limit: String(size + 1) });
    if (before !== null) {
      query.set("before", before.value);
      if (before.encoding) query.set("beforeEncoding", before.encoding);
    }
    const list = await api("GET", `${collectionPath(name)}/generations?${query}`, undefined, signal);
    rememberGenerations(name, list.items);
    const shown = list.items.slice(0, size);
    const more = list.items.length > size;
    older = more ? shown[shown.length - 1].generationId : null;
    document.querySelector("#history tbody").innerHTML =
      shown.map((item, i) => rowHtml(item, i + 1 < list.items.length ? list.items[i + 1] : null)).join("") ||
      '<tr><td colspan="5" class="muted">No commits yet.</td></tr>';
    document.getElementById("page").textContent = `page ${befores.length + 1}${more ? "" : " · the oldest commits"}`;
    document.getElementById("newer").disabled = befores.length === 0;
    document.getElementById("older").disabled = !more;
  };

  const show = async () => {
    clearProblem();
    const text = document.getElementById("before").value.trim();
    setHashQuery("history", name, { before: text, limit: document.getElementById("limit").value });
    befores = [];
    // "older than G": G must exist (an unknown one is refused, not read as the nearest)
    before = text ? await resolveGeneration(name, text, signal) : null;
    await load();
  };

  document.getElementById("history-form").addEventListener("submit", (event) => { event.preventDefault(); show().catch(pageProblem); });
  document.getElementById("older").addEventListener("click", () => {
    if (!older) return;
    befores.push(before);
    before = older;
    load().catch(pageProblem);
  });
  document.getElementById("newer").addEventListener("click", () => {
    if (!befores.length) return;
    before = befores.pop();
    load().catch(pageProblem);
  });
  await show().catch(pageProblem);
  // Live: the newest page follows the commits.
  follow(signal, name, collection.generationId, async (generation) => {
    if (before !== null) {
      banner(`Generation ${idLabel(generation)} committed: go to the newest page to see it`);
      return;
    }
    await load();
    banner(`Generation ${idLabel(generation)} committed at ${new Date().toLocaleTimeString()}`);
  });
}

// ---- Lineage --------------------------------------------------------------------------------------

function lineageHtml(sources) {
  if (!sources.length) return "";
  const items = sources.map((s) => {
    const target = s.collectionName === null
      ? `<span class="stream">${esc(s.target)}</span>`
      : `<a href="#/lineage/${encodeURIComponent(s.collectionName)}${s.toGenerationId ? "?g=" + encodeURIComponent(idLabel(s.toGenerationId)) : ""}">${esc(s.collectionName)}</a>`;
    const same = sameEs(s.fromGenerationId, s.toGenerationId);
    const moved = same ? ' <span class="muted">(did not move)</span>' : "";
    const incomplete = s.incomplete ? ' <span class="tag auto" title="part of this span\'s history was garbage-collected">incomplete</span>' : "";
    const nested = s.sources ? lineageHtml(s.sources) : "";
    const source = s.collectionName; // null: a stream, whose positions are no generations of this store
    // the span as a diff of the source: what this commit read of it
    const diff = source === null || same || s.toGenerationId === null ? "" :
      ` <a class="span-diff" href="#/diff/${encodeURIComponent(source)}?${new URLSearchParams({
        from: s.fromGenerationId === null ? "" : idLabel(s.fromGenerationId), to: idLabel(s.toGenerationId) })}"
        title="the changes of ${esc(source)} this span covers">diff</a>`;
    return `<li class="source" data-reader="${esc(s.readerName)}"><b>${esc(s.readerName)}</b> ← ${target}: <span class="span">${genHtml(source, s.fromGenerationId)} → ${genHtml(source, s.toGenerationId)}</span>${moved}${diff}${incomplete}${nested}</li>`;
  });
  return `<ul class="lineage">${items.join("")}</ul>`;
}

async function viewLineage(signal, name, params) {
  if (!name) return pickCollection(signal, "lineage");
  const collection = await api("GET", collectionPath(name), undefined, signal);
  const depths = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
  const depth = Number(params.get("depth") || 3);
  main().innerHTML = `<h2>Lineage of <code>${esc(name)}</code></h2>
<form class="toolbar" id="lineage-form">
<label>Generation <input id="generation" list="generations" placeholder="current" title="a generation id, or a ref: @current, @open, ~N (N commits back), @reader:NAME, @2026-11-25T10:00:00Z" value="${esc(params.get("g") || "")}"></label>
<datalist id="generations"></datalist>
<label>Depth <select id="depth">${depths.map((d) => `<option${d === depth ? " selected" : ""}>${d}</option>`).join("")}</select></label>
<button type="submit">Show</button>
<a href="#/browse/${encodeURIComponent(name)}">browse this collection</a></form>
<p id="banner" class="banner" hidden></p>
<p class="muted">The readers the commit of a generation moved (from → to), and with depth &gt; 1 what moved the
readers of each source over that span, down to the streams. Sources whose history was garbage-collected are marked incomplete.</p>
<p id="problem" class="error" role="alert" hidden></p><p id="lineage-of"></p><div id="lineage"></div>`;
  fillGenerationList(signal, name);
  const load = async (generationId) => {
    const body = { generationId, depth: Number(document.getElementById("depth").value) };
    const answer = await api("POST", `${collectionPath(name)}/lineage`, body, signal);
    document.getElementById("lineage-of").innerHTML = `Generation ${genHtml(name, answer.generationId)}: ${answer.sources.length} reader(s) moved by its commit`;
    document.getElementById("lineage").innerHTML = lineageHtml(answer.sources) || '<p class="muted">This commit moved no reader.</p>';
  };
  const show = async () => {
    const g = document.getElementById("generation").value.trim();
    setHashQuery("lineage", name, { g, depth: document.getElementById("depth").value });
    clearProblem();
    const generation = g
      ? await resolveGeneration(name, g, signal)
      : (await api("GET", collectionPath(name), undefined, signal)).generationId;
    await load(generation);
  };
  document.getElementById("lineage-form").addEventListener("submit", (event) => { event.preventDefault(); show().catch(pageProblem); });
  await show().catch(pageProblem);
  // Live: the lineage of the current generation follows the commits.
  follow(signal, name, collection.generationId, async (generation) => {
    if (document.getElementById("generation").value.trim()) return; // pinned by the user
    await load(generation);
    banner(`Generation ${idLabel(generation)} committed: lineage updated at ${new Date().toLocaleTimeString()}`);
  });
}

// ---- routing ---------------------------------------------------------------------------------------

function takeTokenFromFragment() {
  // /ui/#token=T (or …&token=T): the token never reaches the server's logs; it is removed from the address.
  const match = location.hash.match(/(^#|[?&])token=([^&]*)/);
  if (!match) return;
  setToken(decodeURIComponent(match[2]));
  let rest = location.hash.replace(/([?&])token=[^&]*&?/, "$1").replace(/^#token=[^&]*&?/, "#").replace(/[?&]$/, "");
  if (rest === "#") rest = "";
  history.replaceState(null, "", location.pathname + location.search + rest);
}

async function render() {
  if (state.view) state.view.abort();
  const controller = new AbortController();
  state.view = controller;
  const { view, name, params } = currentRoute();
  // the previous view and its error go at once: a view that fails must not leave another one on screen
  clearTimeout(showError.timer);
  document.getElementById("error").hidden = true;
  main().innerHTML = '<p class="muted loading">Loading…</p>';
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.dataset.view === view);
  }
  try {
    if (view === "graph") await viewGraph(controller.signal);
    else if (view === "browse") await viewBrowse(controller.signal, name, params);
    else if (view === "diff") await viewDiff(controller.signal, name, params);
    else if (view === "lineage") await viewLineage(controller.signal, name, params);
    else if (view === "history") await viewHistory(controller.signal, name, params);
    else await viewCollections(controller.signal);
  } catch (error) {
    if (!controller.signal.aborted) {
      showError(error);
      main().innerHTML = `<p class="error" role="alert">${esc(error.message || error)}</p>`;
    }
  }
}

window.addEventListener("hashchange", render);
document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromFragment();
  setToken(state.token);
  document.getElementById("forget-token").addEventListener("click", () => { setToken(null); location.reload(); });
  // every generation id drawn with a commit time gets it filled in once on screen
  new MutationObserver((mutations) => {
    for (const mutation of mutations) {
      for (const added of mutation.addedNodes) if (added.nodeType === Node.ELEMENT_NODE) fillTimes(added);
    }
  }).observe(main(), { childList: true, subtree: true });
  render();
});
