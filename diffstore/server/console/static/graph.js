// diffstore console: the pipeline graph (#/graph), a layered drawing whose labels never overlap.
//
// How: a Sugiyama-style layered layout. Each collection sits in the column of its depth (the longest
// chain of readers above it). Every reader (an edge A -> C) gets a box for its label in the gap column
// right after A, and a thin waypoint in every further column it crosses, so an edge is a chain of boxes.
// Within a column the boxes are ordered by the barycenter of their neighbours (fewer crossings), then
// stacked top to bottom with a gap, each as close as it can to its neighbours' height. Columns are as
// wide as their widest box (text measured with the page's own font), so no two boxes -- nodes or labels --
// can overlap, whatever the names. A self-reader (a collection reading itself) is a loop through its
// label box. Loaded by index.html before app.js, which calls layoutGraph and graphSvg.
"use strict";

const GRAPH = {
  nodeFont: 12, labelFont: 11, nodeMaxText: 300, labelMaxText: 240,
  nodeH: 32, labelH: 18, selfH: 34, wayH: 4, padX: 10, gapY: 14, gapX: 34, margin: 16,
};

// Text widths with the page's own font (the SVG's text inherits it), on a canvas.
let measureContext = null;
let pageFont = null;
function textWidth(text, size) {
  measureContext ||= document.createElement("canvas").getContext("2d");
  pageFont ||= getComputedStyle(document.documentElement).fontFamily;
  measureContext.font = `${size}px ${pageFont}`;
  return measureContext.measureText(text).width;
}

// The text as drawn: whole when it fits in `max` pixels, else cut with "…" (the full text on hover).
function fitted(text, size, max) {
  if (textWidth(text, size) <= max) return { text, width: textWidth(text, size) };
  let low = 0, high = text.length;
  while (low < high) {
    const mid = Math.ceil((low + high) / 2);
    if (textWidth(text.slice(0, mid) + "…", size) <= max) low = mid; else high = mid - 1;
  }
  const cut = text.slice(0, low) + "…";
  return { text: cut, width: textWidth(cut, size) };
}

function layoutGraph(overview) {
  const names = new Set(overview.collections.map((c) => c.name));
  const nodes = new Map();
  const edges = [];
  const node = (id, stream) => {
    if (!nodes.has(id)) nodes.set(id, { id, stream, preds: [], depth: 0 });
    return nodes.get(id);
  };
  for (const c of overview.collections) {
    for (const r of c.readers) {
      const stream = !r.targetIsCollection || !names.has(r.target);
      node(r.target, stream);
      const to = node(c.name, false);
      if (r.target !== c.name) to.preds.push(r.target);
      edges.push({ from: r.target, to: c.name, reader: r.readerName, lag: r.lagGenerations, self: r.target === c.name });
    }
  }
  // depth = the longest path from a source (bounded, so a cycle cannot loop forever)
  for (let round = 0; round < nodes.size; round++) {
    let changed = false;
    for (const n of nodes.values()) {
      for (const p of n.preds) {
        const depth = nodes.get(p).depth + 1;
        if (depth > n.depth && depth < nodes.size) { n.depth = depth; changed = true; }
      }
    }
    if (!changed) break;
  }
  // a source sits just left of the first collection that reads it (not always in the first column)
  for (const n of nodes.values()) {
    if (n.preds.length) continue;
    const next = edges.filter((e) => e.from === n.id && !e.self).map((e) => nodes.get(e.to).depth);
    if (next.length) n.depth = Math.max(0, Math.min(...next) - 1);
  }

  // the boxes, column by column: nodes in even columns, labels and waypoints in odd and later ones
  const columns = [];
  const place = (item, column) => { item.column = column; (columns[column] ||= []).push(item); item.prev = []; item.next = []; return item; };
  const link = (a, b) => { a.next.push(b); b.prev.push(a); };
  for (const n of [...nodes.values()].sort((a, b) => a.id.localeCompare(b.id))) {
    const label = fitted(n.id, GRAPH.nodeFont, GRAPH.nodeMaxText);
    Object.assign(n, { kind: "node", text: label.text, w: Math.max(80, label.width + 2 * GRAPH.padX), h: GRAPH.nodeH });
    place(n, 2 * n.depth);
  }
  for (const e of edges) {
    const a = nodes.get(e.from), b = nodes.get(e.to);
    const words = e.lag === null ? e.reader : `${e.reader} · lag ${e.lag}`;
    const label = fitted(words, GRAPH.labelFont, GRAPH.labelMaxText);
    e.label = place({ kind: "label", edge: e, text: label.text, full: words, w: label.width + 8, h: e.self ? GRAPH.selfH : GRAPH.labelH }, a.column + 1);
    e.chain = [a, e.label];
    link(a, e.label);
    if (!e.self) {
      for (let column = a.column + 2; column < b.column; column++) {
        const way = place({ kind: "way", edge: e, w: 1, h: GRAPH.wayH }, column);
        link(e.chain[e.chain.length - 1], way);
        e.chain.push(way);
      }
      link(e.chain[e.chain.length - 1], b);
      e.chain.push(b);
    }
  }
  for (let i = 0; i < columns.length; i++) columns[i] ||= [];

  // order within columns: barycenter sweeps, down then up
  const index = () => columns.forEach((column) => column.forEach((item, i) => { item.order = i; }));
  const mean = (items) => items.reduce((sum, it) => sum + it.order, 0) / items.length;
  index();
  for (let sweep = 0; sweep < 4; sweep++) {
    const forward = sweep % 2 === 0;
    const sequence = forward ? columns.slice(1) : columns.slice(0, -1).reverse();
    for (const column of sequence) {
      const keyed = column.map((item) => {
        const near = forward ? item.prev : item.next;
        return { item, key: near.length ? mean(near) : item.order };
      });
      keyed.sort((x, y) => x.key - y.key || x.item.order - y.item.order);
      keyed.forEach(({ item }, i) => { column[i] = item; });
      column.forEach((item, i) => { item.order = i; });
    }
  }

  // x: each column as wide as its widest box
  let x = GRAPH.margin;
  const columnX = [];
  columns.forEach((column, i) => {
    columnX[i] = { left: x, right: x + Math.max(0, ...column.map((it) => it.w)) };
    x = columnX[i].right + GRAPH.gapX;
    for (const item of column) item.x = columnX[i].left;
  });
  // y: stacked in order, each as near as it can be to the middle of what leads to it
  for (const column of columns) {
    let bottom = GRAPH.margin - GRAPH.gapY;
    for (const item of column) {
      const lead = item.prev.filter((p) => p.y !== undefined);
      const want = lead.length ? lead.reduce((s, p) => s + p.y + p.h / 2, 0) / lead.length - item.h / 2 : bottom + GRAPH.gapY;
      item.y = Math.max(want, bottom + GRAPH.gapY);
      bottom = item.y + item.h;
    }
  }
  const width = Math.max(400, x - GRAPH.gapX + GRAPH.margin);
  const height = Math.max(120, GRAPH.margin + Math.max(0, ...columns.flat().map((it) => it.y + it.h)));
  const isolated = overview.collections.filter((c) => !nodes.has(c.name)).map((c) => c.name);
  return { nodes, edges, columnX, width, height, isolated };
}

// An edge's path through its chain of boxes: straight across each box's column, curved between columns.
function edgePath(e, columnX) {
  const mid = (it) => it.y + it.h / 2;
  const out = (it) => (it.kind === "node" ? it.x + it.w : columnX[it.column].right);
  const into = (it) => (it.kind === "node" ? it.x : columnX[it.column].left);
  const [first, ...rest] = e.chain;
  if (e.self) {
    // out of the node's right side, across the label, back under it into the node's right side
    const label = e.label, ly = label.y + GRAPH.labelH / 2, back = label.y + label.h - 4, r = out(label);
    const x0 = out(first), y0 = mid(first) - 5, y1 = mid(first) + 5, m = (x0 + into(label)) / 2;
    return `M${x0},${y0} C${m},${y0} ${m},${ly} ${into(label)},${ly} L${r},${ly} C${r + 10},${ly} ${r + 10},${back} ${r},${back} L${into(label)},${back} C${m},${back} ${m},${y1} ${x0},${y1}`;
  }
  let d = `M${out(first)},${mid(first)}`;
  let previous = first;
  for (const it of rest) {
    const x0 = out(previous), y0 = mid(previous), x1 = into(it), y1 = mid(it), m = (x0 + x1) / 2;
    d += ` C${m},${y0} ${m},${y1} ${x1},${y1}`;
    if (it.kind !== "node") d += ` L${out(it)},${y1}`;
    previous = it;
  }
  return d;
}

function graphSvg(g) {
  const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${g.width}" height="${g.height}" role="img" aria-labelledby="graph-title">
<title id="graph-title">Pipeline graph: ${g.nodes.size} collections and streams, ${g.edges.length} readers</title>
<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#98a2b3"/></marker></defs>`];
  for (const e of g.edges) {
    const behind = e.lag !== null && e.lag > 0;
    const what = e.self ? `${e.to} reads itself` : `${e.to} reads ${e.from}`;
    parts.push(`<path class="edge${behind ? " behind" : ""}${e.self ? " self" : ""}" data-reader="${esc(e.reader)}" d="${edgePath(e, g.columnX)}" marker-end="url(#arrow)"><title>${esc(what)} (reader ${esc(e.reader)})</title></path>`);
  }
  for (const e of g.edges) {
    const l = e.label;
    const top = l.y + (GRAPH.labelH - 16) / 2;
    parts.push(`<g class="edge-label${e.self ? " self" : ""}" data-reader="${esc(e.reader)}"><rect x="${l.x}" y="${top}" width="${l.w}" height="16" rx="3"/><text x="${l.x + 4}" y="${top + 12}">${esc(l.text)}</text><title>${esc(l.full)}</title></g>`);
  }
  for (const n of g.nodes.values()) {
    const inner = `<rect width="${n.w}" height="${n.h}"/><text x="${GRAPH.padX}" y="${n.h / 2 + 4}">${esc(n.text)}</text><title>${esc(n.id)}</title>`;
    const link = n.stream ? inner : `<a href="#/browse/${encodeURIComponent(n.id)}" aria-label="browse ${esc(n.id)}">${inner}</a>`;
    parts.push(`<g class="node${n.stream ? " stream" : ""}" data-node="${esc(n.id)}" transform="translate(${n.x},${n.y})">${link}</g>`);
  }
  parts.push("</svg>");
  return parts.join("");
}
