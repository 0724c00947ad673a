// Werk dashboard: one render function per panel, fed by the live snapshot.

import {
  badge, bytes, clock, duration, el, percent, replaceChildren, secondsUntil, setText, syncRows,
} from "./format.js";
import { addSample, drawPlot } from "./plot.js";

const $ = (id) => document.getElementById(id);

function gauge(label, used, total) {
  const share = percent(used, total);
  const shown = share === null ? "not sampled" : `${bytes(used)} of ${bytes(total)} (${share.toFixed(1)} %)`;
  const bar = el("div", {
    class: "gauge", role: "progressbar", "aria-label": label,
    "aria-valuemin": "0", "aria-valuemax": "100",
    "aria-valuenow": share === null ? null : share.toFixed(1), "aria-valuetext": shown,
  }, el("div", { class: "fill" }));
  if (share !== null) bar.firstChild.style.width = `${Math.min(100, share)}%`;
  return el("div", {}, el("div", { class: "gauge-label" }, el("span", {}, label), el("span", {}, shown)), bar);
}

export function renderMemory(snapshot) {
  const memory = snapshot.memory;
  const t = snapshot.thresholds;
  const marks = [t.soft, t.hard, t.emergency];
  const gauges = [];
  if (memory.host) {
    const host = gauge("Host memory", memory.host.used_bytes, memory.host.total_bytes);
    for (const m of marks) {
      const mark = el("span", { class: "mark", "aria-hidden": "true" });
      mark.style.left = `${m}%`;
      host.lastChild.append(mark);
    }
    gauges.push(host);
    addSample(Date.now(), percent(memory.host.used_bytes, memory.host.total_bytes));
  } else {
    gauges.push(el("p", {}, "Host memory: could not be sampled."));
  }
  if (memory.accelerators === null) gauges.push(el("p", {}, "Accelerators: could not be sampled."));
  else if (!memory.accelerators.length) gauges.push(el("p", {}, "Accelerators: none on this machine."));
  for (const a of memory.accelerators || []) {
    gauges.push(gauge(`GPU ${a.index}: ${a.name}`, a.used_bytes, a.total_bytes));
  }
  replaceChildren($("gauges"), ...gauges);
  replaceChildren($("pressure"), "Pressure: ", badge(memory.pressure, null, memory.pressure),
    ` (soft from ${t.soft} %, hard from ${t.hard} %, emergency from ${t.emergency} %)`);
  const observed = snapshot.runtimes.runtimes.reduce((sum, r) => sum + (r.observed_bytes || 0), 0);
  const pending = snapshot.runtimes.loading.length;
  const rows = [
    ["Managed (loaded runtimes)", bytes(memory.managed.allocated_bytes)],
    ["Pending (starts in progress)", `${bytes(memory.managed.reserved_bytes)}, ${pending} starting`],
    ["Observed (runtime processes)", bytes(observed)],
  ];
  replaceChildren($("accounting"), ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  drawPlot($("memory-plot"), $("plot-summary"), marks);
}

function keepAlive(runtime) {
  if (!runtime) return "—";
  if (runtime.busy > 0) return `in use (${runtime.busy})`;
  const left = secondsUntil(runtime.idle_until);
  if (left === null) return "kept loaded";
  return `unloads in ${duration(left)}`;
}

export function renderRuntimes(snapshot, act) {
  const running = new Map(snapshot.runtimes.runtimes.map((r) => [r.model, r]));
  const loading = new Map(snapshot.runtimes.loading.map((r) => [r.model, r]));
  const items = snapshot.models.map((m) => ({ model: m, runtime: running.get(m.id), loading: loading.get(m.id) }));
  syncRows($("runtimes").tBodies[0], items, (i) => i.model.id, (item) => {
    const row = el("tr", {}, el("th", { scope: "row" }), el("td"), el("td"), el("td", { class: "num" }),
      el("td", { class: "num" }), el("td", { class: "num" }), el("td"), el("td"));
    const button = el("button", { type: "button" });
    button.addEventListener("click", () => {
      const load = button.dataset.action === "load";
      act(`${load ? "Loading" : "Unloading"} ${item.model.id}`,
        `/werk/v1/models/${encodeURIComponent(item.model.id)}/${load ? "load" : "unload"}`, {});
    });
    row.cells[7].append(button);
    return row;
  }, (row, item) => {
    const r = item.runtime;
    setText(row.cells[0], item.model.id);
    setText(row.cells[1], item.model.backend);
    const state = r ? "resident" : item.loading ? "loading" : "idle";
    const words = r ? "loaded" : item.loading ? `loading: ${item.loading.phase}` : "not loaded";
    if (row.cells[2].textContent !== words) replaceChildren(row.cells[2], badge(state, null, words));
    setText(row.cells[3], r ? r.pid ?? "—" : "—");
    setText(row.cells[4], r ? bytes(r.observed_bytes) : "—");
    setText(row.cells[5], r ? bytes(r.reserved_bytes) : "—");
    setText(row.cells[6], keepAlive(r));
    const button = row.cells[7].firstChild;
    const action = r ? "unload" : "load";
    button.dataset.action = action;
    setText(button, r ? "Unload" : "Load");
    button.setAttribute("aria-label", `${r ? "Unload" : "Load"} ${item.model.id}`);
    button.disabled = Boolean(item.loading);
  });
}

export function renderStates(snapshot, act) {
  const states = snapshot.states;
  $("states-empty").hidden = states.length > 0;
  $("states-more").hidden = !snapshot.more_states;
  syncRows($("states").tBodies[0], states, (s) => s.id, (state) => {
    const box = el("input", { type: "checkbox", "aria-label": `Select ${state.id}`, "data-state": state.id });
    const row = el("tr", {}, el("td", {}, box), el("th", { scope: "row" }), el("td"), el("td"),
      el("td", { class: "num" }), el("td"), el("td"), el("td"));
    const button = el("button", { type: "button" });
    button.addEventListener("click", () => {
      const pinned = button.dataset.pinned === "true";
      act(`${pinned ? "Unpinning" : "Pinning"} ${state.id}`,
        `/werk/v1/states/${encodeURIComponent(state.id)}/pin`, { pinned: !pinned, dry_run: false });
    });
    row.cells[7].append(button);
    return row;
  }, (row, s) => {
    setText(row.cells[1], s.id);
    setText(row.cells[2], s.model);
    setText(row.cells[3], s.tier);
    setText(row.cells[4], bytes(s.logical_bytes));
    const left = secondsUntil(s.expires_at);
    setText(row.cells[5], s.expires_at === null ? "never" : left <= 0 ? "expired" : `in ${duration(left)}`);
    setText(row.cells[6], s.pinned ? "yes" : "no");
    const button = row.cells[7].firstChild;
    button.dataset.pinned = String(s.pinned);
    setText(button, s.pinned ? "Unpin" : "Pin");
    button.setAttribute("aria-label", `${s.pinned ? "Unpin" : "Pin"} ${s.id}`);
  });
}

export function selectedStates() {
  return Array.from(document.querySelectorAll("#states input[type=checkbox]:checked"))
    .map((box) => box.dataset.state);
}

function jobItem(job) {
  const item = el("li", { "data-key": job.id });
  const head = el("div", {}, badge(job.status, null, job.status), " ", job.kind,
    job.model ? ` · ${job.model}` : "", ` · ${clock(job.created_at)}`);
  item.append(head);
  if (job.prompt) item.append(el("div", { class: "note" }, job.prompt));
  if (job.error) item.append(el("div", { class: "error" }, job.error));
  const out = job.output;
  if (out && out.content_type.startsWith("image/")) {
    item.append(el("img", { src: out.url, alt: `Image from job ${job.id}${job.prompt ? `: ${job.prompt}` : ""}`, loading: "lazy" }));
  } else if (out && out.content_type.startsWith("audio/")) {
    item.append(el("audio", { controls: true, preload: "none", src: out.url, "aria-label": `Audio from job ${job.id}` }));
  } else if (out) {
    item.append(el("a", { href: out.url }, `Download (${bytes(out.bytes)})`));
  }
  return item;
}

export function renderJobs(snapshot) {
  const list = $("jobs");
  $("jobs-empty").hidden = snapshot.jobs.length > 0;
  const signature = JSON.stringify(snapshot.jobs.map((j) => [j.id, j.status, j.output && j.output.id]));
  if (list.dataset.signature === signature) return; // unchanged: keep players and images as they are
  list.dataset.signature = signature;
  replaceChildren(list, ...snapshot.jobs.map(jobItem));
}

export function renderReuse(snapshot) {
  const models = snapshot.stats.models;
  $("reuse-empty").hidden = models.length > 0;
  syncRows($("reuse").tBodies[0], models, (m) => m.model, () => el("tr", {}, el("th", { scope: "row" }),
    el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "num" }),
    el("td", { class: "num" }), el("td")), (row, m) => {
    setText(row.cells[0], m.model);
    setText(row.cells[1], m.prefills);
    setText(row.cells[2], m.prompt_tokens);
    setText(row.cells[3], m.cached_tokens);
    const rate = percent(m.cached_tokens, m.prompt_tokens);
    setText(row.cells[4], rate === null ? "—" : `${rate.toFixed(1)} %`);
    const r = m.restores;
    setText(row.cells[5], `${r.verified} verified, ${r.refused} refused of ${r.attempted}`);
  });
}

export function renderActivity(snapshot) {
  const entries = snapshot.activity;
  $("activity-empty").hidden = entries.length > 0;
  syncRows($("activity").tBodies[0], entries, (e) => `${e.at} ${e.method} ${e.path} ${e.milliseconds}`,
    () => el("tr", {}, el("td"), el("td"), el("td"), el("td"), el("td", { class: "num" })), (row, e) => {
      setText(row.cells[0], clock(e.at));
      setText(row.cells[1], `${e.method} ${e.path}`);
      const ok = e.status < 400;
      if (!row.cells[2].firstChild) row.cells[2].append(badge(ok ? "completed" : "failed", null, String(e.status)));
      setText(row.cells[3], e.model);
      setText(row.cells[4], `${e.milliseconds} ms`);
    });
}

export function renderCapabilities(snapshot) {
  const rows = snapshot.capabilities;
  const backends = Array.from(new Set(rows.map((r) => r.backend || "host")))
    .sort((a, b) => (a === "host" ? -1 : b === "host" ? 1 : a.localeCompare(b)));
  const table = $("capabilities");
  const head = table.tHead.rows[0];
  const wanted = ["Capability", ...backends];
  if (Array.from(head.cells).map((c) => c.textContent).join("\n") !== wanted.join("\n")) {
    replaceChildren(head, ...wanted.map((name) => el("th", { scope: "col" }, name)));
  }
  const ids = Array.from(new Set(rows.map((r) => r.id))).sort();
  const signature = JSON.stringify(rows);
  if (table.dataset.signature === signature) return;
  table.dataset.signature = signature;
  const body = ids.map((id) => el("tr", {}, el("th", { scope: "row" }, id), ...backends.map((backend) => {
    const cell = el("td");
    for (const r of rows.filter((x) => x.id === id && (x.backend || "host") === backend)) {
      const label = r.model ? `${r.model}: ${r.status.replace("_", " ")}` : r.status.replace("_", " ");
      cell.append(badge(r.status, r.reason, label));
    }
    if (!cell.childNodes.length) cell.append("—");
    return cell;
  })));
  replaceChildren(table.tBodies[0], ...body);
}
