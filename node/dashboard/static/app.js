// The provider dashboard: reads /dashboard/data every 2 s; the pause switch POSTs with the page's token.
"use strict";
const token = document.querySelector('meta[name="dekube-token"]').content;
let paused = null;

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
      td.textContent = String(value);
      tr.append(td);
    }
    body.append(tr);
  }
}

function show(data) {
  const node = data.node || {};
  const compute = data.compute || {};
  const error = document.getElementById("error");
  const problem = compute.error || compute.last_error || node.error;
  error.hidden = !problem;
  error.textContent = problem || "";
  document.getElementById("peer").textContent = node.peer_id || "";
  const peers = node.peers || [];
  fill("status", [
    ["connected peers", peers.length + " (" + peers.filter((p) => p.relayed).length + " relayed)"],
    ["validator reachable", compute.ledger_reachable ? "yes (" + (compute.ledger || "") + ")" : "no"],
    ["registered", compute.registered ? "yes" : "not yet"],
    ["taking tasks", compute.paused ? "paused" : "yes"],
    ["hardware", compute.hardware ? (compute.hardware.gpu || "CPU only") : "not detected yet"],
  ]);
  const task = compute.current_task;
  fill("task", task ? [["task", task.task_id], ["state", task.state],
    ["progress", task.step + " / " + task.steps], ["loss", task.loss], ["eta (s)", task.eta_s]] : [["task", "none"]]);
  const wallet = compute.wallet || {};
  fill("earnings", [["free balance", wallet.balance], ["bonded", wallet.bonded], ["unbonding", wallet.unbonding],
    ["paid in listed tasks", (compute.payouts || []).reduce((sum, p) => sum + p.amount, 0)]]);
  rows("payouts", compute.payouts || [], (p) => [p.task_id.slice(0, 16), p.status, p.amount]);
  rows("slashes", compute.slashes || [], (s) => [s.task_id.slice(0, 16), s.reason]);
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

refresh();
setInterval(refresh, 2000);
