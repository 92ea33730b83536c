// The provider dashboard: reads /dashboard/data every 2 s; the pause switch POSTs with the page's token.
"use strict";
const token = document.querySelector('meta[name="dekube-token"]').content;
let paused = null;
let limitsShown = false;

function fill(id, pairs) {
  const dl = document.getElementById(id);
  dl.replaceChildren();
  for (const [name, value] of pairs) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = value === null || value === undefined ? "—" : String(value);
    dl.append(dt, dd);
  }
}

function rows(id, list, cells) {
  const body = document.getElementById(id);
  body.replaceChildren();
  for (const item of list) {
    const tr = document.createElement("tr");
    for (const value of cells(item)) {
      const td = document.createElement("td");
      if (value instanceof Node) td.append(value); else td.textContent = String(value);
      tr.append(td);
    }
    body.append(tr);
  }
}

function link(href, text) {   // same-origin paths only (the explorer on this node)
  const a = document.createElement("a");
  if (typeof href === "string" && href.startsWith("/")) a.href = href;
  a.textContent = text;
  return a;
}

function curve(points) {   // cumulative earnings as an SVG polyline (no outside assets)
  const svg = document.getElementById("earnings-curve");
  svg.replaceChildren();
  if (!points.length) return;
  const ns = "http://www.w3.org/2000/svg";
  const w = 600, h = 120, top = points[points.length - 1].total || 1;
  const line = document.createElementNS(ns, "polyline");
  const xs = points.length > 1 ? points.length - 1 : 1;
  line.setAttribute("points", [[0, 0], ...points.map((p, i) => [i + 1, p.total])].map(([i, t]) =>
    (i * (w - 10) / (xs + 1) + 5).toFixed(1) + "," + (h - 5 - t * (h - 10) / top).toFixed(1)).join(" "));
  line.setAttribute("class", "series");
  svg.append(line);
}

function show(data) {
  const node = data.node || {};
  const compute = data.compute || {};
  const bandwidth = data.bandwidth || {};
  const error = document.getElementById("error");
  const problem = compute.error || compute.last_error || node.error;
  error.hidden = !problem;
  error.textContent = problem || "";
  document.getElementById("peer").textContent = node.peer_id || "";
  const problems = document.getElementById("problems");
  problems.replaceChildren(...(compute.problems || []).map((text) => {
    const li = document.createElement("li");
    li.textContent = text;
    return li;
  }));
  const peers = node.peers || [];
  fill("status", [
    ["connected peers", peers.length + " (" + peers.filter((p) => p.relayed).length + " relayed)"],
    ["validator reachable", compute.ledger_reachable ? "yes (" + (compute.ledger || "") + ")" : "no"],
    ["registered", compute.registered ? "yes" : "not yet"],
    ["taking tasks", compute.paused ? "paused" : "yes"],
    ["hardware", compute.hardware ? (compute.hardware.gpu || "CPU only") : "not detected yet"],
    ["bandwidth", bandwidth.upload_mbps ? Math.round(bandwidth.upload_mbps) + " Mbit/s up, " +
      Math.round(bandwidth.download_mbps || 0) + " down" : "not measured yet"],
  ]);
  const task = compute.current_task;
  fill("task", task ? [["task", task.task_id], ["state", task.state],
    ["progress", task.step + " / " + task.steps], ["loss", task.loss], ["eta (s)", task.eta_s],
    ["busy computing", task.utilization == null ? "—" : (100 * task.utilization).toFixed(1) + "% of its training time"]]
    : [["task", "none"]]);
  const wallet = compute.wallet || {};
  fill("earnings", [["free balance", wallet.balance], ["bonded", wallet.bonded], ["unbonding", wallet.unbonding], ["slashed", compute.slashed],
    ["paid in listed tasks", (compute.payouts || []).reduce((sum, p) => sum + p.amount, 0)]]);
  rows("payouts", compute.payouts || [], (p) => [p.task_id.slice(0, 16), p.status, p.amount]);
  rows("slashes", compute.slashes || [], (s) => [s.task_id.slice(0, 16), s.reason, link(s.evidence, "explorer")]);
  rows("audits", compute.audits || [], (a) => [a.task_id.slice(0, 16), a.slot, a.role, a.outcome]);
  rows("owned", compute.owned || [], (t) => [t.task_id.slice(0, 16), t.status, t.workers, t.fetch || "—"]);
  curve(compute.earnings || []);
  document.getElementById("log").textContent = (data.log || []).map((l) =>
    l.time + " " + l.level + " " + l.logger + ": " + l.message).join("\n");
  const limits = data.limits || {};
  fill("limits", [["hours of the day", limits.hours || "any"],
    ["longest task (s)", limits.max_task_s ? limits.max_task_s : "any"],
    ["GPUs lent", limits.cuda_devices === -1 ? "all" : limits.cuda_devices],
    ["CPU cores", limits.cpu_cores ? limits.cpu_cores : "all"],
    ["memory (MB)", limits.memory_mb ? limits.memory_mb : "any"]]);
  if (data.limits && !limitsShown) {   // the form starts from the node's values, then is the user's
    document.getElementById("limit-hours").value = limits.hours;
    document.getElementById("limit-max-task").value = limits.max_task_s;
    document.getElementById("limit-gpus").value = limits.cuda_devices;
    document.getElementById("limit-cores").value = limits.cpu_cores;
    document.getElementById("limit-memory").value = limits.memory_mb;
    limitsShown = true;
  }
  paused = Boolean(compute.paused);
  const button = document.getElementById("pause");
  button.textContent = paused ? "Resume taking tasks" : "Pause (take no new task)";
  button.disabled = data.compute === undefined;
}

async function refresh() {
  try {
    const answer = await fetch("/dashboard/data", { cache: "no-store" });
    show(await answer.json());
  } catch (err) {
    document.getElementById("error").hidden = false;
    document.getElementById("error").textContent = "the node does not answer: " + err;
  }
}

document.getElementById("pause").addEventListener("click", async () => {
  await fetch("/dashboard/pause", { method: "POST", headers: { "Content-Type": "application/json",
    "X-Dekube-Token": token }, body: JSON.stringify({ paused: !paused }) });
  refresh();
});

document.getElementById("save-limits").addEventListener("click", async () => {
  const said = document.getElementById("limits-said");
  const answer = await fetch("/dashboard/limits", { method: "POST", headers: { "Content-Type": "application/json",
    "X-Dekube-Token": token }, body: JSON.stringify({
    hours: document.getElementById("limit-hours").value.trim(),
    max_task_s: Number(document.getElementById("limit-max-task").value || 0),
    cuda_devices: Number(document.getElementById("limit-gpus").value || -1),
    cpu_cores: Number(document.getElementById("limit-cores").value || 0),
    memory_mb: Number(document.getElementById("limit-memory").value || 0) }) });
  const body = await answer.json();
  said.textContent = answer.ok ? "saved" : body.error;
  said.className = answer.ok ? "" : "error";
  refresh();
});

refresh();
setInterval(refresh, 2000);
