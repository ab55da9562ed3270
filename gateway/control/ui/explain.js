// Route explain: a pasted request body → which pool and backend it would go to now, and why.
import { call, get } from "./api.js";
import { byId, el, fill, json, table } from "./dom.js";

let say = () => {};

export function init(status) {
  say = status;
  byId("explain-form").addEventListener("submit", explain);
}

export async function show() {
  try {
    const data = await get("/admin/pools");
    const pin = byId("explain-pin");
    const chosen = pin.value;
    fill(pin, el("option", { value: "" }, "no pin"), data.pools.map((p) => el("option", { value: p.name }, p.name)));
    pin.value = chosen;
    const area = byId("explain-body");
    const model = data.pools.flatMap((p) => Object.keys(p.models))[0];
    // an example for an empty body - not under the operator's cursor (what they type next would follow it)
    if (!area.value && model && document.activeElement !== area) {
      area.value = JSON.stringify({ model, messages: [{ role: "user", content: "Hello!" }], max_tokens: 16 }, null, 2);
    }
  } catch (err) {
    if (err.status !== 401 && err.status !== 403) say("Could not read the pools: " + err.message, "error");
  }
}

export function hide() {}

async function explain(ev) {
  ev.preventDefault();
  const out = byId("explain-result");
  const pin = byId("explain-pin").value;
  try {
    const ans = await call("POST", "/admin/routes/explain", {
      raw: byId("explain-body").value,
      headers: pin ? { "x-gateway-pool": pin } : {},
    });
    const rows = [
      ["routable", ans.routable ? "yes" : "no"],
      ["pool", json(ans.pool)],
      ["backend", json(ans.backend)],
      ["reason", json(ans.reason)],
      ["affinity", json(ans.affinity)],
    ];
    // whatever else the gateway explains (e.g. what the engines' KV events say a backend holds)
    for (const [k, v] of Object.entries(ans)) {
      if (!["routable", "pool", "backend", "reason", "affinity", "features"].includes(k)) rows.push([k, json(v)]);
    }
    const features = Object.entries(ans.features || {}).map(([k, v]) => [k, json(v)]);
    fill(
      out,
      el("h3", {}, "Decision"),
      table([], rows.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", { "data-explain": k }, v))), { class: "kv" }),
      el("h3", {}, "Request features"),
      table(["feature", "value"], features, { class: "kv" }),
    );
    say(ans.routable ? `Would go to ${ans.pool} / ${ans.backend} (${ans.reason}).` : "Not routable now: " + json(ans.reason));
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    fill(out, el("p", { class: "error", role: "alert" }, `The gateway refused this request (${err.status}): ${err.message}`));
    say("Explain failed: " + err.message, "error");
  }
}
