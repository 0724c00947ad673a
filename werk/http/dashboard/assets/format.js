// Werk dashboard: formatting helpers and DOM building (text only: no HTML from data).

export function bytes(value) {
  if (value === null || value === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = value;
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) { n /= 1024; unit += 1; }
  return `${n.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function percent(part, whole) {
  if (!whole) return null;
  return (100 * part) / whole;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s >= 86400) return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  const m = Math.floor(s / 60);
  return `${m}:${String(s % 60).padStart(2, "0")}`;
}

export function secondsUntil(iso) {
  if (!iso) return null;
  return (Date.parse(iso) - Date.now()) / 1000;
}

export function clock(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString();
}

// el("td", {class: "num"}, "text", child...) — attributes are set as attributes, strings as text.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// A status in words and colour (never colour alone), with an optional reason shown on hover or
// focus and read by screen readers.
export function badge(status, reason, label) {
  const text = label || String(status).replace("_", " ");
  const node = el("span", { class: `badge s-${status}`, tabindex: reason ? "0" : null }, text);
  if (reason) node.append(el("span", { class: "tip" }, ` — ${reason}`));
  return node;
}

// Keep one <tr> per key; build a row once (build) and refresh its cells in place (update), so
// buttons and focus survive the updates.
export function syncRows(tbody, items, key, build, update) {
  const existing = new Map();
  for (const row of Array.from(tbody.rows)) existing.set(row.dataset.key, row);
  let previous = null;
  for (const item of items) {
    const k = key(item);
    let row = existing.get(k);
    if (row) existing.delete(k);
    else { row = build(item); row.dataset.key = k; }
    update(row, item);
    const wanted = previous ? previous.nextSibling : tbody.firstChild;
    if (wanted !== row) tbody.insertBefore(row, wanted);
    previous = row;
  }
  for (const row of existing.values()) row.remove();
}

export function setText(node, text) {
  const value = text === null || text === undefined ? "—" : String(text);
  if (node.textContent !== value) node.textContent = value;
}

export function replaceChildren(node, ...children) {
  node.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}
