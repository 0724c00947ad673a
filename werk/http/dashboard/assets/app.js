// Werk dashboard: sign-in, the live stream, and the actions (through the protocol's own routes).

import {
  renderActivity, renderCapabilities, renderJobs, renderMemory, renderReuse, renderRuntimes,
  renderStates, selectedStates,
} from "./panels.js";
import { el, replaceChildren } from "./format.js";

const $ = (id) => document.getElementById(id);
let source = null;

function say(text) { $("action-result").textContent = text; }
function connection(text) { $("connection").textContent = text; }

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (response.status === 401) { await start(); throw new Error("signed out: sign in again"); }
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

async function act(what, path, body) {
  say(`${what}…`);
  try {
    await post(path, body);
    say(`${what}: done.`);
  } catch (error) {
    say(`${what}: ${error.message}`);
  }
}

function render(snapshot) {
  $("server-line").textContent =
    `Werk ${snapshot.werk_version} · ${snapshot.auth === "api_key" ? "API keys" : "local mode, no key"}` +
    ` · up since ${new Date(snapshot.started_at).toLocaleString()}`;
  renderMemory(snapshot);
  renderRuntimes(snapshot, act);
  renderStates(snapshot, act);
  renderJobs(snapshot);
  renderReuse(snapshot);
  renderActivity(snapshot);
  renderCapabilities(snapshot);
}

function connect() {
  if (source) source.close();
  connection("Connecting…");
  source = new EventSource("/dashboard/events");
  source.addEventListener("snapshot", (event) => {
    connection("Live");
    render(JSON.parse(event.data));
  });
  source.addEventListener("problem", (event) => connection(`Update failed: ${JSON.parse(event.data).message}`));
  source.addEventListener("ended", (event) => {
    source.close();
    source = null;
    const reason = JSON.parse(event.data).message;
    const again = el("button", { type: "button" }, "Reconnect");
    again.addEventListener("click", connect);
    replaceChildren($("connection"), `Not live: ${reason}. `, again);
  });
  source.addEventListener("error", () => {
    if (source && source.readyState === EventSource.CLOSED) {
      source = null;
      start(); // the session may have ended: ask again
    } else {
      connection("Reconnecting…");
    }
  });
}

function showSignIn(visible) {
  $("sign-in-panel").hidden = !visible;
  $("panels").hidden = visible;
  if (visible) $("api-key").focus();
}

async function start() {
  let state;
  try {
    const response = await fetch("/dashboard/session", { credentials: "same-origin" });
    if (!response.ok) throw new Error(await errorText(response));
    state = await response.json();
  } catch (error) {
    connection(`Cannot reach the server: ${error.message}`);
    setTimeout(start, 3000);
    return;
  }
  $("sign-out").hidden = state.auth !== "api_key" || !state.signed_in;
  if (!state.signed_in) {
    if (source) { source.close(); source = null; }
    connection("Signed out");
    showSignIn(true);
    return;
  }
  showSignIn(false);
  connect();
}

$("sign-in").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("api-key");
  $("sign-in-error").textContent = "";
  const response = await fetch("/dashboard/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ api_key: key.value }),
  });
  key.value = "";
  if (!response.ok) {
    $("sign-in-error").textContent = `Sign-in refused: ${await errorText(response)}`;
    return;
  }
  start();
});

$("sign-out").addEventListener("click", async () => {
  await fetch("/dashboard/session", { method: "DELETE", credentials: "same-origin" });
  start();
});

let plan = [];
$("prune-preview").addEventListener("click", async () => {
  const ids = selectedStates();
  if (!ids.length) { say("Select the states to prune first."); return; }
  try {
    const result = await post("/werk/v1/states/prune", { ids, dry_run: true });
    plan = result.selected;
    $("prune-summary").textContent = plan.length
      ? `Preview: ${plan.length} state(s) would be deleted${result.skipped.length ? `, ${result.skipped.length} skipped` : ""}.`
      : "Preview: nothing would be deleted.";
    replaceChildren($("prune-list"),
      ...plan.map((id) => el("li", {}, id)),
      ...result.skipped.map((s) => el("li", {}, `${s.id}: skipped (${s.reason.replaceAll("_", " ")})`)));
    $("prune-confirm").hidden = !plan.length;
    $("prune-plan").hidden = false;
    (plan.length ? $("prune-confirm") : $("prune-cancel")).focus();
  } catch (error) {
    say(`Preview failed: ${error.message}`);
  }
});
$("prune-cancel").addEventListener("click", () => {
  $("prune-plan").hidden = true;
  plan = [];
  $("prune-preview").focus();
});
$("prune-confirm").addEventListener("click", async () => {
  try {
    const result = await post("/werk/v1/states/prune", { ids: plan, dry_run: false });
    const skipped = result.skipped.map((s) => `${s.id} (${s.reason.replaceAll("_", " ")})`);
    say(`Pruned ${result.deleted.length} state(s).${skipped.length ? ` Skipped: ${skipped.join(", ")}.` : ""}`);
  } catch (error) {
    say(`Pruning failed: ${error.message}`);
  }
  $("prune-plan").hidden = true;
  plan = [];
  $("prune-preview").focus();
});

start();
