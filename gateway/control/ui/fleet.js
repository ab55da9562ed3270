// Pools with their weights (editable) and backends with health, circuit, in-flight, engine load and
// drain / undrain. Refreshed every few seconds while this tab is shown and the page is visible.
import { get, put, seg } from "./api.js";
import { byId, el, fill, table } from "./dom.js";
import { refresher } from "./refresh.js";

const EVERY_MS = 3000;
const tab = refresher(load, EVERY_MS, () => byId("autorefresh").checked);
let say = () => {};
/** pool name -> its card's live parts, so a refresh does not wipe a weight being edited */
let cards = new Map();

export function init(status) {
  say = status;
  byId("autorefresh").addEventListener("change", tab.schedule);
}

export const show = () => tab.show();
export const hide = () => tab.hide();

async function load() {
  tab.loading();
  try {
    const data = await get("/admin/pools");
    if (!tab.shown) return;
    render(data);
    byId("fleet-updated").textContent =
      "updated " + new Date().toLocaleTimeString() + (data.shared_state ? " · shared state (Redis)" : " · this replica only");
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    say("Could not read the pools: " + err.message, "error");
  }
  tab.schedule();
}

function render(data) {
  const names = data.pools.map((p) => p.name).join("\n");
  if (names !== [...cards.keys()].join("\n")) {
    cards = new Map(data.pools.map((p) => [p.name, card(p)]));
    fill(byId("fleet-body"), [...cards.values()].map((c) => c.root));
  }
  for (const pool of data.pools) {
    const c = cards.get(pool.name);
    c.weightNow.textContent = String(pool.weight);
    if (c.input.dataset.dirty !== "1" && document.activeElement !== c.input) c.input.value = String(pool.weight);
    fill(c.backends, backends(pool));
  }
}

function card(pool) {
  const input = el("input", {
    type: "number",
    min: "0",
    step: "any",
    required: true,
    "data-weight": pool.name,
    "aria-label": "new weight of pool " + pool.name,
    // once the operator touches the field, refreshes leave its value alone until it is applied
    onfocus: () => {
      input.dataset.dirty = "1";
    },
    oninput: () => {
      input.dataset.dirty = "1";
    },
  });
  const weightNow = el("strong", { "data-weight-now": pool.name });
  const form = el(
    "form",
    { class: "weight", onsubmit: (ev) => setWeight(ev, pool.name, input) },
    el("span", {}, "weight ", weightNow),
    input,
    el("button", { type: "submit", "data-apply": pool.name }, "Apply"),
  );
  const caps = [pool.tool_calling ? "tools" : null, pool.structured_output ? "structured output" : null].filter(Boolean);
  const models = Object.entries(pool.models).map(([pub, served]) => (pub === served ? pub : pub + " → " + served));
  const backendsHolder = el("div");
  const root = el(
    "article",
    { class: "pool", "data-pool": pool.name },
    el("header", {}, el("h3", {}, pool.name), el("span", { class: "dim" }, pool.dialect + " · " + models.join(", ") + (caps.length ? " · " + caps.join(", ") : "")), form),
    backendsHolder,
  );
  return { root, input, weightNow, backends: backendsHolder };
}

async function setWeight(ev, pool, input) {
  ev.preventDefault();
  const weight = Number(input.value);
  if (!Number.isFinite(weight) || weight < 0 || input.value.trim() === "") {
    say("A weight is a number ≥ 0.", "error");
    return;
  }
  try {
    const ans = await put(`/admin/pools/${seg(pool)}/weight`, { weight });
    input.dataset.dirty = "";
    say(`Pool ${pool}: weight set to ${weight}` + (ans.shared ? " (shared by every replica)." : " (this replica only)."));
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    say(`Pool ${pool}: ${err.message}`, "error");
  }
  load();
}

function backends(pool) {
  const rows = pool.backends.map((b) => {
    const load = b.load;
    const health = b.healthy === true ? "healthy" : b.healthy === false ? "unhealthy" : "unknown";
    const kv = load && typeof load.kv_usage === "number" ? Math.round(load.kv_usage * 1000) / 10 + " %" : "—";
    const button = el(
      "button",
      { type: "button", class: b.draining ? "undrain" : "drain", "data-backend": b.name, onclick: () => drain(b.name, !b.draining) },
      b.draining ? "Undrain" : "Drain",
    );
    return el(
      "tr",
      { "data-backend-row": b.name, class: b.draining ? "draining" : "" },
      el("td", {}, b.name),
      el("td", { class: "mono" }, b.url),
      el("td", {}, el("span", { class: "badge " + health }, health)),
      el("td", {}, el("span", { class: "badge circuit-" + b.circuit }, b.circuit)),
      el("td", { "data-state": "draining" }, b.draining ? "draining" : "serving"),
      el("td", { class: "num" }, String(b.in_flight)),
      el("td", { class: "num" }, String(b.requests_total)),
      el("td", { class: "num" }, load ? String(load.running) : "—"),
      el("td", { class: "num" }, load ? String(load.waiting) : "—"),
      el("td", { class: "num" }, kv),
      el("td", { class: "num" }, load ? load.age_s.toFixed(1) + " s" : "—"),
      el("td", {}, button),
    );
  });
  return table(
    ["backend", "URL", "health", "circuit", "state", "in flight", "requests", "running", "waiting", "KV use", "load age", ""],
    rows,
    { class: "backends" },
  );
}

async function drain(name, draining) {
  try {
    await put(`/admin/backends/${seg(name)}/drain`, { draining });
    say(draining ? `Backend ${name} drained: no new requests, in-flight ones finish.` : `Backend ${name} serves again.`);
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    say(`Backend ${name}: ${err.message}`, "error");
  }
  load();
}
