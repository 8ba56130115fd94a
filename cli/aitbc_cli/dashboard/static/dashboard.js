// The aitbc dashboard's pages: plain DOM, text only (never innerHTML: workers' words are strangers' words),
// charts drawn as inline SVG. A training's page listens to the server's event stream; it never polls.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token");
const COLORS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00"];

function withToken(url) {
  return TOKEN ? url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN) : url;
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(c));
  return el;
}

function eth(wei) {
  if (wei === null || wei === undefined) return "-";
  const big = BigInt(wei), unit = 10n ** 18n;
  const frac = ((big % unit) * 10000n / unit).toString().padStart(4, "0");
  return `${big / unit}.${frac}`;
}

function short(text, head = 8, tail = 6) {
  const s = String(text ?? "");
  return s.length > head + tail + 1 ? `${s.slice(0, head)}…${s.slice(-tail)}` : s;
}

function num(x, digits = 4) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }

function fill(tbody, rows) { tbody.replaceChildren(...rows); }

async function getJSON(url) {
  const response = await fetch(withToken(url));
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// -- charts: a line per series over rounds -------------------------------------------------------------

function lineChart(container, series, yLabel) {
  const W = 420, H = 200, L = 48, R = 10, T = 20, B = 28;
  const points = series.flatMap((s) => s.points);
  if (!points.length) { container.replaceChildren(h("p", { class: "note" }, "no rounds yet")); return; }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img" });
  chart.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#99a" }));
  chart.append(svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#99a" }));
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    chart.append(svg("text", { x: L - 4, y: Y(y) + 3, "text-anchor": "end" }, y.toPrecision(3)));
  }
  for (const x of [...new Set(xs)].sort((a, b) => a - b)) {
    chart.append(svg("text", { x: X(x), y: H - B + 14, "text-anchor": "middle" }, String(x)));
  }
  chart.append(svg("text", { x: (L + W) / 2, y: H - 2, "text-anchor": "middle" }, "round"));
  chart.append(svg("text", { x: L - 4, y: 10, "text-anchor": "end" }, yLabel)); // above the top tick
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const sorted = [...s.points].sort((a, b) => a[0] - b[0]);
    chart.append(svg("polyline", { fill: "none", stroke: color, "stroke-width": 2,
      points: sorted.map(([x, y]) => `${X(x)},${Y(y)}`).join(" ") }));
    for (const [x, y] of sorted) chart.append(svg("circle", { cx: X(x), cy: Y(y), r: 2.5, fill: color }));
  });
  const legend = h("div", { class: "legend" }, series.map((s, i) =>
    h("span", {}, swatch(COLORS[i % COLORS.length]), s.name)));
  container.replaceChildren(chart, legend);
}

function swatch(color) {
  const el = h("i", {});
  el.style.background = color; // through the CSSOM: the page's policy refuses inline style attributes
  return el;
}

// -- the index: trainings and the market --------------------------------------------------------------

async function showIndex() {
  const note = document.getElementById("trainings-note");
  try {
    const { trainings } = await getJSON("/api/trainings");
    note.textContent = trainings.length ? `${trainings.length} trainings, newest first`
      : "no trainings in this home yet";
    fill(document.querySelector("#trainings tbody"), trainings.map((t) => h("tr", {
      class: "link", onclick: () => { location.href = withToken(`/trainings/${encodeURIComponent(t.training_id)}`); },
    }, h("td", { class: "mono" }, t.training_id), h("td", {}, t.model_type), h("td", {}, t.phase),
    h("td", {}, `${t.round}/${t.rounds}`), h("td", {}, `${t.workers}/${t.target_workers}`),
    h("td", {}, t.driven ? "yes" : "no"),
    h("td", {}, t.error ? h("span", { class: "error" }, t.error) : `${eth(t.spent_wei)} / ${eth(t.deposit_wei)}`),
    h("td", {}, new Date(t.created_at * 1000).toLocaleString()))));
  } catch (err) { note.textContent = String(err.message || err); note.className = "note error"; }
  const marketNote = document.getElementById("market-note");
  try {
    const { offers } = await getJSON("/api/market");
    marketNote.textContent = `${offers.length} offers, best score first`;
    fill(document.querySelector("#market tbody"), offers.map((o) => h("tr", {},
      h("td", { class: "mono" }, o.provider), h("td", {}, o.hardware), h("td", {}, eth(o.price_wei)),
      h("td", {}, eth(o.stake_wei)), h("td", {}, num(o.reputation, 2)),
      h("td", {}, `${o.completed}/${o.failed}/${o.slashes}`), h("td", {}, String(o.free_slots)),
      h("td", {}, num(o.score, 3)))));
  } catch (err) { marketNote.textContent = String(err.message || err); }
}

// -- a training's page ---------------------------------------------------------------------------------

function metricName(view) {
  for (const r of view.round_metrics) {
    const names = Object.keys(r.metrics || {}).filter((n) => n !== "loss");
    if (names.length) return names.includes("accuracy") ? "accuracy" : names[0];
  }
  return null;
}

function megabytes(rounds, key) {
  return rounds.filter((r) => r[key] != null).map((r) => [r.round, r[key] / 1e6]);
}

function definitions(items, valueClass) {
  return h("dl", {}, items.flatMap(([k, v]) => [h("dt", {}, k), h("dd", valueClass ? { class: valueClass } : {}, v)]));
}

function renderCharts(view) {
  const rounds = view.round_metrics;
  const metric = metricName(view);
  const val = [{ name: "validation loss", points: rounds.map((r) => [r.round, r.loss]) }];
  if (metric) {
    const scored = rounds.filter((r) => metric in r.metrics);
    val.push({ name: metric, points: scored.map((r) => [r.round, r.metrics[metric]]) });
  }
  lineChart(document.getElementById("chart-val"), val, "");
  const workers = {};
  for (const { round, losses } of view.worker_losses) {
    for (const [w, loss] of Object.entries(losses)) (workers[w] ||= []).push([round, loss]);
  }
  lineChart(document.getElementById("chart-workers"),
    Object.entries(workers).map(([w, points]) => ({ name: short(w), points })), "loss");
  lineChart(document.getElementById("chart-bytes"), [
    { name: "sent", points: megabytes(rounds, "bytes_sent") },
    { name: "received", points: megabytes(rounds, "bytes_received") },
  ], "MB");
}

function renderSummary(view) {
  const c = view.cost;
  const items = [["phase", view.phase], ["round", `${view.round}/${view.rounds}`], ["model", view.model_type],
    ["workers", String(view.workers.length)],
    ["spent so far", `${eth(c.spent_wei)} ETH of ${eth(c.deposit_wei)} deposited`]];
  if (view.failure) items.push(["failed", view.failure]);
  if (view.verification) {
    const v = view.verification;
    items.push(["verification",
      `${v.checks} spot checks, ${v.failed} failed, verifiers paid ${eth(v.verifier_wei)} ETH`]);
  }
  document.getElementById("summary").replaceChildren(definitions(items));
}

function renderTables(view, state) {
  const perRound = Object.fromEntries(view.cost.per_round_wei.map((r) => [r.round, r.wei]));
  fill(document.querySelector("#workers tbody"), view.workers.map((w) => h("tr", {
    class: "link" + (w.worker_id === state.worker ? " selected" : ""), "data-worker": w.worker_id,
    onclick: () => selectWorker(state, w.worker_id),
  }, h("td", { class: "mono" }, short(w.worker_id)), h("td", {}, w.role), h("td", {}, w.status),
  h("td", {}, String(w.round)),
  h("td", {}, `${w.epoch}/${w.epochs}`), h("td", {}, `${Math.round(w.progress)}%`), h("td", {}, num(w.loss)),
  h("td", {}, w.samples_per_s ? Math.round(w.samples_per_s).toLocaleString() : "-"), h("td", {}, eth(w.paid_wei)))));
  fill(document.querySelector("#rounds tbody"), view.round_metrics.map((r) => h("tr", {},
    h("td", {}, String(r.round)), h("td", {}, num(r.loss)),
    h("td", {}, Object.entries(r.metrics || {}).map(([k, v]) => `${k} ${num(v)}`).join(", ")),
    h("td", {}, String(r.workers)), h("td", {}, r.bytes_sent?.toLocaleString() ?? "-"),
    h("td", {}, r.bytes_received?.toLocaleString() ?? "-"), h("td", {}, num(r.round_seconds, 1)),
    h("td", {}, eth(perRound[r.round])))));
  const c = view.cost, e = view.escrow;
  const refund = view.audit.filter((a) => a.event === "refund").at(-1);
  const funded = view.audit.filter((a) => a.event === "escrow_funded").at(-1);
  const items = [["spent so far", `${eth(c.spent_wei)} ETH (paid on chain ${eth(c.paid_wei)})`],
    ["per round", c.mean_round_wei ? `${eth(c.mean_round_wei)} ETH on average` : "-"],
    ["projected to completion", c.projected_wei ? `${eth(c.projected_wei)} ETH` : "-"],
    ["deposit", e ? `${eth(e.deposited_wei)} ETH in ${e.address}` : "no escrow yet"]];
  if (funded) items.push(["deposit tx", funded.fields.tx]);
  if (e) items.push(["paid / refunded / held", `${eth(e.paid_wei)} / ${eth(e.refunded_wei)} / ${eth(e.held_wei)} ETH`]);
  if (refund) items.push(["refund tx", refund.fields.tx]);
  for (const [w, wei] of Object.entries(c.per_worker_wei)) items.push([`worker ${short(w)}`, `${eth(wei)} ETH`]);
  document.getElementById("cost").replaceChildren(definitions(items, "mono"));
  fill(document.querySelector("#payments tbody"), view.payments.map((p) => h("tr", {},
    h("td", { class: "mono" }, p.worker_id), h("td", {}, eth(p.amount_wei)), h("td", { class: "mono" }, p.tx_hash))));
  document.getElementById("audit-note").textContent = `${view.audit_entries} entries, chain verified; newest first`;
  fill(document.querySelector("#audit tbody"), [...view.audit].reverse().map((a) => h("tr", {},
    h("td", {}, String(a.seq)), h("td", {}, new Date(a.ts * 1000).toLocaleTimeString()), h("td", {}, a.event),
    h("td", { class: "mono" }, Object.entries(a.fields)
      .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ").slice(0, 300)))));
}

function renderWorker(state) {
  const section = document.getElementById("worker");
  const view = state.view, id = state.worker;
  const w = view && view.workers.find((x) => x.worker_id === id);
  if (!w) { section.hidden = true; return; }
  section.hidden = false;
  document.getElementById("worker-id").textContent = id;
  const losses = view.worker_losses.filter((r) => id in r.losses).map((r) => `round ${r.round}: ${num(r.losses[id])}`);
  const paid = view.payments.filter((p) => p.worker_id === id).map((p) => `${eth(p.amount_wei)} ETH in ${p.tx_hash}`);
  const events = view.audit.filter((a) => a.fields.worker === id).map((a) => `#${a.seq} ${a.event}` +
    (a.fields.round !== undefined ? ` round ${a.fields.round}` : "") + (a.fields.reason ? `: ${a.fields.reason}` : ""));
  const mine = (kind) => view.events.filter((e) => e.event === kind && e.worker === id);
  const checks = mine("spot_check"), passed = checks.filter((c) => c.passed === true).length;
  const offer = state.market && typeof state.market === "object" ? state.market[id.toLowerCase()] : undefined;
  const standing = offer ? `reputation ${num(offer.reputation, 2)}, ${eth(offer.stake_wei)} ETH bonded, ` +
    `${offer.completed} completed / ${offer.failed} failed / ${offer.slashes} slashed on chain`
    : typeof state.market === "string" ? `market not reachable: ${state.market}`
    : state.market ? "no current offer on the market" : "asking the market...";
  const items = [["role", w.role], ["status", w.status], ["round", String(w.round)],
    ["epoch", `${w.epoch}/${w.epochs}`],
    ["progress", `${Math.round(w.progress)}%`], ["loss now", num(w.loss)], ["paid", `${eth(w.paid_wei)} ETH`],
    ["spend so far", `${eth(view.cost.per_worker_wei[id] ?? "0")} ETH`],
    ["spot checks", checks.length ? `${passed} passed, ${checks.length - passed} failed` : "none yet"],
    ["slashed here", String(mine("slashed").length)], ["on the market", standing],
    ["loss per round", losses.join("; ") || "-"], ["payments", paid.join("; ") || "-"],
    ["events", events.join("; ") || "-"]];
  document.getElementById("worker-detail").replaceChildren(definitions(items, "mono"));
}

function selectWorker(state, id) {
  state.worker = id;
  const path = `/trainings/${encodeURIComponent(state.id)}/workers/${encodeURIComponent(id)}`;
  history.replaceState(null, "", withToken(path));
  for (const row of document.querySelectorAll("#workers tbody tr")) {
    row.classList.toggle("selected", row.dataset.worker === id);
  }
  renderWorker(state);
}

function render(state, view) {
  state.view = view;
  document.getElementById("status").textContent =
    `${view.phase}, round ${view.round}/${view.rounds}` + (view.finished ? " (finished)" : " (live)");
  renderSummary(view);
  renderCharts(view);
  renderTables(view, state);
  renderWorker(state);
}

function showTraining() {
  const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const state = { id: parts[1], worker: parts[3] || null, view: null, market: null };
  // each worker's standing (reputation, bond, record) is the market's: asked once, as the index asks it
  getJSON("/api/market").then(({ offers }) => {
    state.market = Object.fromEntries(offers.map((o) => [o.provider.toLowerCase(), o]));
  }, (err) => { state.market = String(err.message || err); }).then(() => renderWorker(state));
  document.getElementById("training-id").textContent = state.id;
  document.title = `${state.id} · aitbc dashboard`;
  const events = new EventSource(withToken(`/api/trainings/${encodeURIComponent(state.id)}/events`));
  events.addEventListener("snapshot", (e) => {
    const view = JSON.parse(e.data);
    render(state, view);
    if (view.finished) events.close(); // the server has ended the stream: do not reconnect
  });
  events.addEventListener("error", (e) => {
    const status = document.getElementById("status");
    if (e.data) { status.textContent = JSON.parse(e.data).error; status.classList.add("error"); events.close(); }
    else if (!state.view || !state.view.finished) status.textContent = "connection lost; reconnecting…";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const a of document.querySelectorAll("a[data-link]")) a.href = withToken(a.dataset.link);
  if (document.body.dataset.page === "training") showTraining();
  else showIndex();
});
