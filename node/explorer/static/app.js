// dekube explorer: reads the serving node's public JSON-RPC (POST /) and websocket (/ws, topics
// newHeads and tasks); training progress from compute nodes' dkb_taskProgress (this node's own RPC
// and any URLs the user lists, each shown with whose data it is). No framework, no build step,
// nothing from other sites.
(function () {
"use strict";

const {lineChart, chartLegend} = window.dekubeChart;
const BLOCKS_SHOWN = 20;
const MAX_NODES = 64;          // peers looked up one by one beyond the registered nodes
const MAX_LISTED_NODES = 1000;  // registered nodes read with dkb_listNodes
const PROGRESS_POLL_MS = 1000;
const SLOW_REFRESH_MS = 5000;
const ACTIVE_TASK = new Set(["created", "assigned", "running", "committed", "verified", "disputed"]);

const state = {
  chainId: null, height: null, blocks: new Map(), validators: null, tasks: [], nodes: new Map(),
  peers: [], progressUrls: [], endpointPeer: new Map(), noProgress: new Set(), curves: new Map(),
  unreachable: new Map(), listedNodes: [], taskWorkers: new Map(),
  taskEvents: new Map(), ledger: true, live: false, detailTimer: null,
};
let rpcId = 0;

class RpcError extends Error {
  constructor(error) { super(error.message || "RPC error"); this.code = error.code; this.data = error.data; }
}

async function rpc(method, params = [], url = "/") {
  const resp = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({jsonrpc: "2.0", id: ++rpcId, method, params})});
  const doc = await resp.json();
  if (doc.error) throw new RpcError(doc.error);
  return doc.result;
}

// ---- small DOM helpers (text only: nothing from the chain is parsed as HTML)
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "onclick") node.addEventListener("click", value);
    else if (value !== undefined && value !== null) node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const $ = (id) => document.getElementById(id);
const short = (id) => (typeof id === "string" && id.length > 16 ? `${id.slice(0, 8)}…${id.slice(-6)}` : String(id));
const badge = (text) => el("span", {class: `badge ${text}`}, text);
const fmtInt = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");
function fmtBytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
// the bytes a task's circuits carried through relays, as its workers reported them at commit (docs/adr/0223):
// per worker, per relay and in all; entries that are not byte counts are left out
function relayBytesOf(task) {
  const byWorker = {}, byRelay = {};
  let total = 0;
  const reports = task.relay_bytes && typeof task.relay_bytes === "object" ? task.relay_bytes : {};
  for (const [worker, report] of Object.entries(reports)) {
    for (const [relay, n] of Object.entries(report && typeof report === "object" ? report : {})) {
      if (typeof n !== "number" || !Number.isFinite(n) || n < 0) continue;
      byWorker[worker] = (byWorker[worker] || 0) + n;
      byRelay[relay] = (byRelay[relay] || 0) + n;
      total += n;
    }
  }
  return {byWorker, byRelay, total};
}
function fmtTime(ms) { return typeof ms === "number" ? new Date(ms).toLocaleTimeString() : "–"; }
function replaceRows(tbody, rows) { tbody.replaceChildren(...rows); }
function notice(text) { const n = $("notice"); n.hidden = !text; n.textContent = text || ""; }
function kv(obj) {
  if (obj === null || obj === undefined) return "–";
  if (typeof obj !== "object") return String(obj);
  const parts = Object.entries(obj).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`);
  return parts.length ? parts.join(", ") : "–";
}

// ---- head and blocks
async function loadBlock(height) {
  const block = await rpc("dkb_getBlockByNumber", [height, false]);
  if (block) state.blocks.set(block.height, block);
  for (const h of [...state.blocks.keys()]) if (h <= (state.height || 0) - BLOCKS_SHOWN * 3) state.blocks.delete(h);
  return block;
}

async function loadHead() {
  state.chainId = await rpc("dkb_chainId");
  state.height = await rpc("dkb_blockNumber");
  $("chain-id").textContent = state.chainId;
  const from = Math.max(1, state.height - BLOCKS_SHOWN + 1);
  const heights = [];
  for (let h = state.height; h >= from; h--) if (!state.blocks.has(h)) heights.push(h);
  await Promise.all(heights.map(loadBlock));
  renderHead();
  renderBlocks();
}

function renderHead() {
  $("height").textContent = fmtInt(state.height);
  const recent = [...state.blocks.values()].sort((a, b) => a.height - b.height).slice(-BLOCKS_SHOWN);
  if (recent.length >= 2) {
    const span = (recent[recent.length - 1].time_ms - recent[0].time_ms) / 1000;
    const rate = span > 0 ? (recent.length - 1) / span : 0;
    $("block-rate").textContent = `${rate.toFixed(2)} blocks/s (${(span / (recent.length - 1)).toFixed(2)} s/block)`;
  }
}

// Runs of two or more blocks without transactions fold into one row ("12–31: 20 empty blocks").
function foldEmpty(blocks) {
  const rows = [];
  for (const b of blocks) {
    const last = rows[rows.length - 1];
    if (b.transactions.length === 0 && last && last.empty && last.low === b.height + 1) {
      last.low = b.height;
      last.count += 1;
    } else {
      rows.push({empty: b.transactions.length === 0, high: b.height, low: b.height, count: 1, block: b});
    }
  }
  return rows;
}

function blockRow(b) {
  return el("tr", {class: "clickable", "data-height": b.height, onclick: () => { location.hash = `#block/${b.height}`; }},
    el("td", {}, b.height), el("td", {}, fmtTime(b.time_ms)), el("td", {}, b.transactions.length),
    el("td", {class: "mono"}, short(b.proposer)), el("td", {class: "mono"}, short(b.hash)));
}

function renderBlocks() {
  const recent = [...state.blocks.values()].sort((a, b) => b.height - a.height).slice(0, BLOCKS_SHOWN);
  replaceRows($("block-rows"), foldEmpty(recent).map((row) => (row.count === 1 ? blockRow(row.block)
    : el("tr", {class: "folded", "data-heights": `${row.low}-${row.high}`},
      el("td", {}, `${row.low}–${row.high}`), el("td", {colspan: 4, class: "hint"},
        `${row.count} empty blocks`)))));
}

async function onNewHead(header) {
  state.height = Math.max(state.height || 0, header.height);
  await loadBlock(header.height);
  renderHead();
  renderBlocks();
  renderValidators();
}

// ---- validators (missed blocks: committee members absent from a block's commit, over the loaded blocks)
async function loadValidators() {
  state.validators = await rpc("dkb_getValidators");
  renderValidators();
}

function renderValidators() {
  const v = state.validators;
  if (!v) return;
  const bonded = new Map(v.candidates.map((c) => [c.peer_id, c.bonded]));
  const blocks = [...state.blocks.values()].filter((b) => Array.isArray(b.commit) && b.commit.length);
  const missed = new Map(), proposed = new Map();
  for (const b of blocks) {
    const signed = new Set(b.commit.map((vote) => vote.validator));
    for (const {peer_id: pid} of v.validators) if (!signed.has(pid)) missed.set(pid, (missed.get(pid) || 0) + 1);
    proposed.set(b.proposer, (proposed.get(b.proposer) || 0) + 1);
  }
  $("validators-note").textContent = `committee from height ${v.epoch_start}, total power ${fmtInt(v.total_power)}; `
    + `missed and proposed counted over the last ${blocks.length} blocks`;
  replaceRows($("validator-rows"), v.validators.map(({peer_id: pid, power}) => el("tr", {},
    el("td", {class: "mono"}, pid), el("td", {}, fmtInt(power)), el("td", {}, fmtInt(bonded.get(pid))),
    el("td", {}, missed.get(pid) || 0), el("td", {}, proposed.get(pid) || 0))));
}

// ---- tasks
async function loadTasks() {
  state.tasks = await rpc("dkb_listTasks", [null, null, 100]);
  state.tasks.sort((a, b) => (b.created_height || 0) - (a.created_height || 0));
  replaceRows($("task-rows"), state.tasks.map((t) => el("tr", {class: "clickable", "data-task": t.task_id,
    onclick: () => { location.hash = `#task/${t.task_id}`; }},
  el("td", {class: "mono"}, short(t.task_id)), el("td", {title: t.reason || null}, badge(t.status)),
  el("td", {}, `${(t.spec && t.spec.model) || "?"} / ${(t.spec && t.spec.dataset) || "?"}`
    + (t.spec && t.spec.hyperparams && t.spec.hyperparams.steps ? `, ${t.spec.hyperparams.steps} steps` : "")),
  el("td", {}, (t.workers || []).length), el("td", {}, fmtInt(t.price)), el("td", {}, t.created_height))));
}

function onTaskEvent(event) {
  if (event.task_id) {
    const list = state.taskEvents.get(event.task_id) || [];
    list.push(event);
    state.taskEvents.set(event.task_id, list.slice(-50));
  }
  scheduleTasksRefresh();
}

let tasksRefresh = null;
function scheduleTasksRefresh() {
  if (tasksRefresh) return;
  tasksRefresh = setTimeout(async () => {
    tasksRefresh = null;
    await guarded(loadTasks);
    const m = location.hash.match(/^#task\/([0-9a-f]{64})$/);
    if (m) await guarded(() => showTask(m[1], false));
  }, 300);
}

// ---- nodes and relays
function knownPeers() {
  const ids = new Set(state.peers);
  if (state.validators) {
    state.validators.validators.forEach((v) => ids.add(v.peer_id));
    state.validators.candidates.forEach((c) => ids.add(c.peer_id));
  }
  state.tasks.forEach((t) => (t.workers || []).forEach((w) => ids.add(w)));
  state.tasks.forEach((t) => Object.keys(t.relay_claims || {}).forEach((r) => ids.add(r)));
  return [...ids].slice(0, MAX_NODES);
}

function relayOf(addr) {
  const m = /\/p2p\/([^/]+)\/p2p-circuit/.exec(addr);
  return m ? m[1] : null;
}

// Every registered node (dkb_listNodes: relays and verifier-only compute nodes too), plus records of
// peers seen elsewhere that the list did not return.
async function loadNodes() {
  try { state.peers = await rpc("dkb_peers"); } catch (err) { state.peers = []; }
  const registered = await rpc("dkb_listNodes", [null, null, MAX_LISTED_NODES]);
  state.listedNodes = Array.isArray(registered) ? registered : [];
  for (const n of state.listedNodes) if (n && typeof n.peer_id === "string") state.nodes.set(n.peer_id, n);
  const listed = await Promise.all(state.progressUrls.map((url) => endpointPeer(url).catch(() => null)));
  const ids = [...new Set([...listed.filter(Boolean), ...knownPeers()])].filter((id) => !state.nodes.has(id))
    .slice(0, MAX_NODES);
  const records = await Promise.all(ids.map((id) => rpc("dkb_getNode", [id]).catch(() => null)));
  ids.forEach((id, i) => { if (records[i]) state.nodes.set(id, records[i]); });
  renderNodes();
  renderRelays();
}

function bandwidthOf(hw) {
  if (!hw || typeof hw !== "object") return "–";
  const keys = Object.keys(hw).filter((k) => /bandwidth|mbps|bps/i.test(k));
  return keys.length ? keys.map((k) => `${k}: ${hw[k]}`).join(", ") : "–";
}

function renderNodes() {
  const rows = [...state.nodes.entries()].sort((a, b) => a[1].roles.join().localeCompare(b[1].roles.join()));
  replaceRows($("node-rows"), rows.map(([id, n]) => {
    const relays = [...new Set((n.relay_addrs || []).map(relayOf).filter(Boolean))];
    const hw = Object.fromEntries(Object.entries(n.hardware || {}).filter(([k]) => !/bandwidth|mbps|bps/i.test(k)));
    const reach = relays.length ? `relayed via ${relays.map(short).join(", ")}`
      : `direct (${(n.listen_addrs || []).length} addrs)`;
    return el("tr", {"data-peer": id}, el("td", {class: "mono"}, short(id)), el("td", {}, (n.roles || []).join(", ")),
      el("td", {}, kv(hw)), el("td", {}, bandwidthOf(n.hardware)), el("td", {}, reach),
      el("td", {}, n.reputation ?? "–"));
  }));
}

// ---- model coverage (served ranges announced in node records, ADR 0174)
async function loadCoverage() {
  const models = new Map();
  for (const node of state.listedNodes) {
    for (const r of (node.hardware && Array.isArray(node.hardware.serving)) ? node.hardware.serving : []) {
      if (typeof r.model !== "string" || !(r.start < r.end)) continue;
      if (!models.has(r.model)) models.set(r.model, []);
      models.get(r.model).push({peer: node.peer_id, start: r.start, end: r.end, tps: r.tokens_per_s || 0});
    }
  }
  state.coverage = models;
  renderCoverage();
}

function renderCoverage() {
  const rows = [...(state.coverage || new Map()).entries()].sort((a, b) => a[0].localeCompare(b[0]));
  replaceRows($("model-rows"), rows.map(([model, ranges]) => {
    const layers = Math.max(...ranges.map((r) => r.end));
    const count = Array.from({length: layers}, (_, i) => ranges.filter((r) => r.start <= i && i < r.end));
    const tps = count.map((held) => held.reduce((sum, r) => sum + r.tps, 0));
    const weakest = Math.min(...tps);
    const cells = count.map((held, i) => el("span", {class: held.length ? "block" : "block gap",
      title: `block ${i}: ${held.length} server(s), ${tps[i]} tokens/s`}, String(held.length)));
    const servers = ranges.map((r) => `${short(r.peer)} ${r.start}:${r.end} (${r.tps}/s)`).join(", ");
    return el("tr", {"data-model": model}, el("td", {class: "mono"}, model), el("td", {}, `0:${layers}`),
      el("td", {}, ...cells), el("td", {}, count.some((held) => !held.length) ? "gap" : `${weakest} tokens/s`),
      el("td", {}, servers));
  }));
}

function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    out.push({name: m[1], labels, value: Number(m[4])});
  }
  return out;
}

async function loadRelayLocal() {
  const lines = [await trafficLine("/", "this node")];
  for (const url of state.progressUrls) {   // listed nodes' own counters (they must allow this origin)
    const peer = state.endpointPeer.get(url);
    lines.push(await trafficLine(url.replace(/\/+$/, "") + "/", peer ? short(peer) : url).catch(() => null));
  }
  $("relay-local").replaceChildren(...lines.filter(Boolean).map((line) => el("p", {}, line)));
}

async function trafficLine(base, who) {
  const resp = await fetch(`${base}metrics`);
  const samples = parseMetrics(await resp.text());
  const sum = (name, pred) => samples.filter((s) => s.name === name && (!pred || pred(s.labels)))
    .reduce((acc, s) => acc + s.value, 0);
  const relayed = samples.find((s) => s.name === "dekube_relay_bytes_total");
  const parts = [
    `${who}: p2p bytes direct ${fmtBytes(sum("dekube_p2p_bytes_sent_total", (l) => l.path === "direct")
      + sum("dekube_p2p_bytes_received_total", (l) => l.path === "direct"))}`,
    `over relays ${fmtBytes(sum("dekube_p2p_bytes_sent_total", (l) => l.path === "relayed")
      + sum("dekube_p2p_bytes_received_total", (l) => l.path === "relayed"))}`,
  ];
  if (relayed) {
    parts.push(`relayed for others ${fmtBytes(relayed.value)}`,
      `circuits ${sum("dekube_relay_circuits")}`, `reservations ${sum("dekube_relay_reservations")}`);
  }
  return parts.join(" · ");
}

function renderRelays() {
  const relays = new Map();
  const entry = (id) => relays.get(id) || relays.set(id, {paid: 0, tasks: 0, nodes: 0}).get(id);
  for (const [id, n] of state.nodes) if ((n.roles || []).includes("relay")) entry(id);
  for (const t of state.tasks) {
    for (const [relay, amount] of Object.entries(t.relay_claims || {})) {
      const e = entry(relay);
      e.paid += amount;
      e.tasks += 1;
    }
  }
  for (const n of state.nodes.values()) {
    for (const relay of new Set((n.relay_addrs || []).map(relayOf).filter(Boolean))) entry(relay).nodes += 1;
  }
  replaceRows($("relay-rows"), [...relays.entries()].map(([id, e]) => el("tr", {},
    el("td", {class: "mono"}, short(id)), el("td", {}, fmtInt(e.paid)), el("td", {}, e.tasks),
    el("td", {}, e.nodes))));
}

// ---- training progress (dkb_taskProgress on compute nodes)
function progressEndpoints() { return ["/", ...state.progressUrls]; }

async function endpointPeer(url) {
  if (!state.endpointPeer.has(url)) state.endpointPeer.set(url, await rpc("dkb_peerId", [], url));
  return state.endpointPeer.get(url);
}

async function pollProgress(taskId) {
  const curves = state.curves.get(taskId) || new Map();
  state.curves.set(taskId, curves);
  await Promise.all(progressEndpoints().map(async (url) => {
    const key = `${url} ${taskId}`;
    if (state.noProgress.has(url)) return;
    let job, peer;
    try {
      peer = await endpointPeer(url);
      job = await rpc("dkb_taskProgress", [taskId], url);
      state.unreachable.delete(url);
    } catch (err) {
      if (err instanceof RpcError && err.code === -32601) state.noProgress.add(url);   // no compute role
      else if (err instanceof RpcError) state.unreachable.set(url, err.message);       // e.g. no such job
      else state.unreachable.set(url, unreachableReason(url));
      return;
    }
    const curve = curves.get(peer) || {loss: new Map(), metrics: new Map(), job: null, key, url};
    curve.job = job;
    const points = Array.isArray(job.history) ? job.history : [];
    for (const p of points) {
      if (p.loss !== null && p.loss !== undefined) curve.loss.set(p.step, p.loss);
      for (const [name, value] of Object.entries(p.metrics || {})) {
        if (!curve.metrics.has(name)) curve.metrics.set(name, new Map());
        curve.metrics.get(name).set(p.step, value);
      }
    }
    if (typeof job.loss === "number" && typeof job.step === "number") curve.loss.set(job.step, job.loss);
    curves.set(peer, curve);
  }));
  return curves;
}

// Why a listed node's RPC could not be read: the browser hides the cause of a failed cross-origin
// fetch, so name both (the node is down, or it does not send CORS headers to this page's origin).
function unreachableReason(url) {
  return url === "/" ? "this node's RPC did not answer"
    : `no answer readable from this page: the node is down or unreachable, or its RPC does not allow this `
      + `page's origin ${location.origin} (set [rpc] cors = true and add ${location.origin} to [rpc] allowed_origins)`;
}

const hostOf = (url) => (url === "/" ? "this node" : url.replace(/^https?:\/\//, "").replace(/\/+$/, ""));

// Whose data each curve is: the URL it was read from and the peer that answered; whether that peer is a
// worker of the task on chain. Figures from listed nodes are their own reports, not chain data.
function provenance(taskId, curves) {
  const workers = new Set(state.taskWorkers.get(taskId) || []);
  const lines = [...curves.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([peer, curve]) => el("li",
    {"data-source": curve.url}, `${hostOf(curve.url)} answered as `, el("span", {class: "mono"}, peer),
    workers.has(peer) ? " (a worker of this task)" : el("b", {class: "warn"}, " (NOT a worker of this task on chain)")));
  for (const [url, why] of state.unreachable) {
    lines.push(el("li", {class: "unreachable", "data-source": url}, `${hostOf(url)}: ${why}`));
  }
  if (!state.progressUrls.length && state.noProgress.has("/")) {
    lines.push(el("li", {class: "hint"}, "this node has no compute role: list compute nodes' RPC URLs below the "
      + "task table (testnet up prints an explorer link that does)"));
  }
  return el("ul", {class: "sources"}, lines);
}

function renderCurves(container, curves, taskId) {
  const workers = [...curves.keys()].sort();
  const series = (pick) => workers.map((w) => ({name: `${short(w)} @ ${hostOf(curves.get(w).url)}`,
    points: [...pick(curves.get(w)).entries()].sort((a, b) => a[0] - b[0])}));
  const charts = el("div", {class: "charts"});
  charts.appendChild(el("div", {id: "curve-loss"}, lineChart("training loss per step", series((c) => c.loss))));
  const metricNames = [...new Set(workers.flatMap((w) => [...curves.get(w).metrics.keys()]))].sort();
  for (const name of metricNames) {
    charts.appendChild(el("div", {class: "curve-metric", "data-metric": name},
      lineChart(`eval ${name} per step`, series((c) => c.metrics.get(name) || new Map()))));
  }
  const states = workers.map((w) => {
    const job = curves.get(w).job || {};
    return `${short(w)}: ${job.state || "?"} step ${job.step ?? "?"}${job.steps ? `/${job.steps}` : ""}`
      + (typeof job.bytes_sent === "number" ? `, sent ${fmtBytes(job.bytes_sent)}` : "");
  });
  container.replaceChildren(charts, chartLegend(workers.map((w) => `${short(w)} @ ${hostOf(curves.get(w).url)}`)),
    el("p", {class: "hint"}, workers.length ? states.join(" · ")
      : "no compute node reachable from this page has a job for this task"),
    el("p", {class: "hint"}, "Progress is what each node reports about itself (not chain data):"),
    provenance(taskId, curves));
}

// ---- detail views (#block/N, #task/ID)
function closeButton() {
  return el("button", {class: "close", onclick: () => { location.hash = ""; }}, "close");
}

async function showBlock(height) {
  const block = await rpc("dkb_getBlockByNumber", [height, true]);
  const detail = $("detail");
  if (!block) { detail.replaceChildren(closeButton(), el("p", {}, `no block ${height}`)); return; }
  const txRows = block.transactions.map((tx) => el("tr", {},
    el("td", {class: "mono"}, short(tx.hash)), el("td", {}, tx.type || tx.error || "?"),
    el("td", {class: "mono"}, short(tx.from)), el("td", {}, tx.nonce ?? "–"), el("td", {}, tx.fee ?? "–"),
    el("td", {class: "mono"}, tx.payload ? JSON.stringify(tx.payload).slice(0, 160) : "")));
  detail.replaceChildren(closeButton(), el("h2", {}, `Block ${block.height}`),
    el("p", {class: "mono"}, `hash ${block.hash}`), el("p", {}, `time ${fmtTime(block.time_ms)} · proposer `,
      el("span", {class: "mono"}, block.proposer), ` · signed by ${(block.commit || []).length} validators`),
    el("h3", {}, `Transactions (${block.transactions.length})`),
    el("table", {}, el("thead", {}, el("tr", {}, ["hash", "type", "from", "nonce", "fee", "payload"]
      .map((h) => el("th", {}, h)))), el("tbody", {id: "block-tx-rows"}, txRows)));
}

// Task deadlines are block times in ms (docs/adr/0187), told from the ledger's time the document carries.
function durationText(ms) {
  const s = Math.floor(Math.max(0, ms) / 1000);
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  if (s >= 60) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${s}s`;
}

function dueText(task, deadline) {
  if (typeof deadline !== "number") return "";
  const now = task.block_time_ms;
  if (typeof now !== "number" || !now) return `at block time ${deadline} ms`;
  return deadline >= now ? `in ${durationText(deadline - now)}` : `passed ${durationText(now - deadline)} ago`;
}

// A task cut into epochs (docs/adr/0203): its closed epochs of the total, or the one its crew stopped in.
function epochText(task) {
  const total = (task.spec || {}).epochs;
  const progress = task.epochs || {};
  if (!(total > 1) || typeof progress.current !== "number") return "";
  if (typeof progress.stopped === "number") return ` · stopped in epoch ${progress.stopped + 1}/${total}`;
  // workers named to a seat its occupant left (docs/adr/0226): joiner -> [seat, first epoch]
  const joined = Object.keys(progress.joined || {}).length;
  // epochs paid out once their audits resolved (docs/adr/0230)
  const paid = Array.isArray(progress.released) ? progress.released.length : 0;
  return ` · epochs ${progress.current}/${total} closed` + (paid ? ` · ${paid} paid out` : "")
    + (joined ? ` · ${joined} joined` : "");
}

const TIMELINE = [["created", "created_height"], ["assigned", "assigned_height"], ["committed", null],
  ["audit slots", null], ["audited", null], ["paid", null]];

const slotsOf = (task) => (Array.isArray(task.slots) ? task.slots : []);

function timeline(task) {
  const commits = Object.keys(task.commits || {}).length;
  const slots = slotsOf(task);
  const resolved = slots.filter((s) => s.outcome && s.outcome !== "pending").length;
  const done = {created: true, assigned: !!task.assigned_height, committed: commits > 0,
    "audit slots": slots.length > 0, audited: slots.length > 0 && resolved === slots.length,
    paid: ["paid", "stopped", "finalized"].includes(task.status)};
  const items = TIMELINE.map(([name, field]) => el("li", {class: done[name] ? "done" : ""},
    name + (field && task[field] ? ` @${task[field]}` : "")
      + (name === "committed" ? ` (${commits}/${(task.workers || []).length})${epochText(task)}` : "")
      + (name === "committed" && ["assigned", "running"].includes(task.status) && task.commit_deadline
        ? ` · due ${dueText(task, task.commit_deadline)}` : "")
      + (name === "audit slots" && slots.length ? ` (${slots.length})` : "")
      + (name === "audited" && slots.length ? ` (${resolved}/${slots.length})` : "")));
  if (!done.paid && !ACTIVE_TASK.has(task.status)) items.push(el("li", {}, badge(task.status)));
  return el("ul", {class: "timeline"}, items);
}

// An audit slot (docs/adr/0168): a drawn segment of one worker, its verifiers' answers (match or
// mismatch, with evidence), the worker's dispute, the referees' votes, the outcome.
function answerCell(who, answer, due, redraw) {
  const what = answer ? [badge(answer.match ? "match" : "mismatch"),
    answer.match || !answer.step ? "" : ` from step ${answer.step}`, ` ${short(answer.evidence)}`]
    : [` no answer${due ? ` (due ${due})` : ""}`];
  return el("div", {}, el("span", {class: "mono"}, short(who)), " ", ...what, redraw ? " (redrawn)" : "");
}

function slotRow(task, slot) {
  const verifiers = (slot.verifiers || []).map((v) => answerCell(v.verifier, v.answer, dueText(task, v.deadline),
    v.redraw));
  const referees = (slot.referees || []).map((r) => answerCell(r.referee, r.vote,
    dueText(task, slot.referee_deadline), false));
  const dispute = slot.dispute ? `disputed @${slot.dispute.height}`
    : slot.dispute_deadline && slot.outcome === "pending" ? `may dispute: due ${dueText(task, slot.dispute_deadline)}`
      : "–";
  return el("tr", {"data-slot": slot.slot}, el("td", {}, slot.slot), el("td", {class: "mono"}, short(slot.worker)),
    el("td", {}, slot.segment), el("td", {}, verifiers.length ? verifiers : "none eligible"), el("td", {}, dispute),
    el("td", {}, referees.length ? referees : "–"), el("td", {}, badge(slot.outcome || "pending")));
}

async function showTask(taskId, first = true) {
  const detail = $("detail");
  let task;
  try {
    task = await rpc("dkb_getTask", [taskId]);
  } catch (err) {   // a task pruned after it ended: the node says so (docs/adr/0215)
    if (!(err instanceof RpcError) || !(err.data && err.data.pruned)) throw err;
    detail.replaceChildren(closeButton(), el("p", {}, err.message));
    return;
  }
  if (!task) {
    detail.replaceChildren(closeButton(), el("p", {}, `no task ${taskId} in the chain state: it is not in a block `
      + "yet, it was never submitted on this chain, or it ended long ago and was pruned (docs/adr/0215)"));
    return;
  }
  state.taskWorkers.set(taskId, Array.isArray(task.workers) ? task.workers : []);
  const spec = task.spec || {};
  const payouts = task.payouts || {};
  const rejections = task.rejections || {};
  const slots = slotsOf(task);
  const commitOf = (w) => {
    const c = (task.commits || {})[w];
    return c ? `committed${Array.isArray(c) && typeof c[c.length - 1] === "number" ? ` @${c[c.length - 1]}` : ""}` : "–";
  };
  const outcomesOf = (w) => slots.filter((s) => s.worker === w).map((s) => badge(s.outcome || "pending"));
  const relayed = relayBytesOf(task);
  const workerRows = (task.workers || []).map((w) => el("tr", {}, el("td", {class: "mono"}, short(w)),
    el("td", {}, commitOf(w)), el("td", {}, outcomesOf(w).length ? outcomesOf(w) : "–"),
    el("td", {}, fmtInt(payouts[w])), el("td", {}, w in relayed.byWorker ? fmtBytes(relayed.byWorker[w]) : "–"),
    el("td", {}, rejections[w] || "")));
  const events = (state.taskEvents.get(taskId) || []).map((e) => el("li", {}, `@${e.height} ${e.event}`));
  let curves = $("task-curves");
  if (first || !curves) {
    curves = el("div", {id: "task-curves"});
    detail.replaceChildren(closeButton(), el("h2", {}, "Task ", el("span", {class: "mono"}, taskId)),
      el("div", {id: "task-body"}), el("h3", {}, "Training curves"), curves);
  }
  const hyper = spec.hyperparams || {};
  $("task-body").replaceChildren(...[
    el("p", {}, badge(task.status), ` owner `, el("span", {class: "mono"}, short(task.owner)),
      ` · price ${fmtInt(task.price)} · escrow ${fmtInt(task.escrow)} · model ${spec.model || "?"}`
      + ` · dataset ${spec.dataset || "?"} · steps ${hyper.steps || spec.steps || "?"}`
      + ` · codec ${spec.codec || "?"}`
      + (task.result ? ` · result ${short(task.result)}` : "") + (task.reason ? ` · ${task.reason}` : "")),
    timeline(task), events.length ? el("ul", {class: "hint"}, events) : null,
    el("h3", {}, `Workers (${(task.workers || []).length})`),
    el("table", {}, el("thead", {}, el("tr", {}, ["worker", "commit", "audit slots", "payout", "relayed", "rejected"]
      .map((h) => el("th", {}, h)))), el("tbody", {id: "task-worker-rows"}, workerRows)),
    el("h3", {}, `Audit slots (${slots.length})` + (task.profile ? ` · profile ${task.profile}` : "")),
    slots.length ? el("table", {}, el("thead", {}, el("tr", {}, ["slot", "worker", "segment", "verifiers",
      "dispute", "referees", "outcome"].map((h) => el("th", {}, h)))), el("tbody", {id: "task-slot-rows"},
      slots.map((slot) => slotRow(task, slot)))) : el("p", {class: "hint"}, "drawn when the commit phase closes"),
    el("h3", {}, "Payouts"), el("p", {class: "mono"}, Object.entries(payouts)
      .map(([p, a]) => `${short(p)}: ${fmtInt(a)}`).join(" · ") || "none yet"),
    el("h3", {}, "Relay claims"), el("p", {class: "mono"}, Object.entries(task.relay_claims || {})
      .map(([p, a]) => `${short(p)}: ${fmtInt(a)}`).join(" · ") || "none"),
    el("h3", {}, "Relay bytes"), el("p", {class: "mono", id: "task-relay-bytes"}, Object.keys(relayed.byRelay).length
      ? `${fmtBytes(relayed.total)} through relays (the workers' circuit counts at commit): `
        + Object.entries(relayed.byRelay).map(([r, n]) => `${short(r)}: ${fmtBytes(n)}`).join(" · ")
      : "none reported (all direct, or no commit yet)"),
  ].filter((child) => child !== null));
  renderCurves(curves, await pollProgress(taskId), taskId);
}

async function route() {
  clearInterval(state.detailTimer);
  state.detailTimer = null;
  const detail = $("detail");
  const block = location.hash.match(/^#block\/(\d+)$/);
  const task = location.hash.match(/^#task\/([0-9a-f]{64})$/);
  if (block) {
    detail.hidden = false;
    await guarded(() => showBlock(Number(block[1])));
  } else if (task) {
    detail.hidden = false;
    await guarded(() => showTask(task[1], true));
    state.detailTimer = setInterval(() => guarded(async () => {
      renderCurves($("task-curves"), await pollProgress(task[1]), task[1]);
    }), PROGRESS_POLL_MS);
  } else {
    detail.hidden = true;
    detail.replaceChildren();
  }
}

// ---- live updates
function connectWebsocket() {
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`);
  const subs = new Map();
  ws.addEventListener("open", () => {
    ws.send(JSON.stringify({jsonrpc: "2.0", id: "heads", method: "dkb_subscribe", params: ["newHeads"]}));
    ws.send(JSON.stringify({jsonrpc: "2.0", id: "tasks", method: "dkb_subscribe", params: ["tasks"]}));
  });
  ws.addEventListener("message", (msg) => {
    let doc;
    try { doc = JSON.parse(msg.data); } catch (err) { return; }
    if (doc.id === "heads" || doc.id === "tasks") {
      if (doc.result) subs.set(doc.result, doc.id);
      setLive(subs.size > 0, doc.error ? doc.error.message : null);
    } else if (doc.method === "dkb_subscription") {
      const kind = subs.get(doc.params.subscription);
      if (kind === "heads") guarded(() => onNewHead(doc.params.result));
      else if (kind === "tasks") onTaskEvent(doc.params.result);
    } else if (doc.method === "dkb_subscriptionDropped") {
      ws.close();
    }
  });
  ws.addEventListener("close", () => { setLive(false); setTimeout(connectWebsocket, 3000); });
}

function setLive(on, why) {
  state.live = on;
  const live = $("live");
  live.textContent = on ? "websocket" : (why ? `polling (${why})` : "reconnecting");
  live.className = on ? "on" : "off";
}

async function guarded(fn) {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof RpcError && err.code === -32601) {
      state.ledger = false;
      notice("This node serves no ledger reads (not a validator): chain views are empty; "
        + "open /explorer on a validator's RPC.");
    } else {
      notice(`${err.message || err}`);
    }
    return undefined;
  }
}

async function slowRefresh() {
  if (!state.live) await guarded(loadHead);   // websocket down: poll the head
  await guarded(loadValidators);
  await guarded(loadTasks);
  await guarded(loadNodes);
  await guarded(loadCoverage);
  await guarded(loadRelayLocal);
  $("peers").textContent = String(state.peers.length);
}

async function main() {
  const params = new URLSearchParams(location.search);
  state.progressUrls = (params.get("nodes") || "").split(",").map((s) => s.trim()).filter(Boolean);
  $("progress-nodes").value = state.progressUrls.join(", ");
  if (state.progressUrls.length) {   // a link may name any node: say whose data joins this node's
    const sources = $("sources");
    sources.hidden = false;
    sources.textContent = "This link adds training progress and traffic reported by other nodes, not by this "
      + `node or the chain: ${state.progressUrls.join(", ")}. Each curve is labelled with where it came from.`;
  }
  $("progress-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const urls = $("progress-nodes").value.split(",").map((s) => s.trim()).filter(Boolean);
    const next = new URLSearchParams(location.search);
    next.set("nodes", urls.join(","));
    location.search = next.toString();
  });
  window.addEventListener("hashchange", route);
  await guarded(loadHead);
  if (state.ledger) connectWebsocket();
  await slowRefresh();
  await route();
  document.body.setAttribute("data-ready", "1");
  setInterval(slowRefresh, SLOW_REFRESH_MS);
}

main();
})();
