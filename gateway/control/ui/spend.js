// Spend of a tenant (or a user, or an API key) per UTC day and month, by model, with its budgets.
import { get } from "./api.js";
import { byId, el, fill, json, table } from "./dom.js";

let say = () => {};

export function init(status) {
  say = status;
  byId("spend-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    report();
  });
  byId("spend-scope").addEventListener("change", scope);
  scope();
}

export async function show() {
  // tenants offered from the API keys (a convenience: any tenant can be typed)
  try {
    const data = await get("/admin/api-keys");
    const tenants = [...new Set(data.keys.map((k) => k.tenant).filter(Boolean))].sort();
    fill(byId("spend-tenants"), tenants.map((t) => el("option", { value: t })));
  } catch {
    fill(byId("spend-tenants"));
  }
}

export function hide() {}

function scope() {
  const user = byId("spend-scope").value === "user";
  for (const node of document.querySelectorAll("#spend-form .user-only")) node.hidden = !user;
  byId("spend-value").setAttribute("list", byId("spend-scope").value === "tenant" ? "spend-tenants" : "");
}

function money(usd) {
  return typeof usd === "number" ? "$" + usd.toFixed(6) : json(usd);
}

async function report() {
  const kind = byId("spend-scope").value;
  const query = new URLSearchParams();
  query.set(kind, byId("spend-value").value.trim());
  if (kind === "user" && byId("spend-user-tenant").value.trim()) query.set("tenant", byId("spend-user-tenant").value.trim());
  if (byId("spend-date").value.trim()) query.set("date", byId("spend-date").value.trim());
  const out = byId("spend-result");
  try {
    const r = await get("/admin/spend?" + query.toString());
    const who = r.scope === "tenant" ? "tenant " + r.tenant : r.scope === "key" ? "API key " + r.key : "user " + r.user + (r.tenant ? " of tenant " + r.tenant : "");
    const periods = r.periods.map((p) =>
      el(
        "tr",
        { "data-period": p.period },
        el("td", {}, p.period + (p.current ? " (current)" : "")),
        el("td", { class: "mono" }, p.id),
        el("td", { class: "num", "data-field": "requests" }, String(p.requests)),
        el("td", { class: "num", "data-field": "tokens" }, String(p.tokens)),
        el("td", { class: "num", "data-field": "usd" }, money(p.usd)),
        el("td", { class: "num" }, `${p.reserved.tokens} tokens, ${money(p.reserved.usd)}`),
      ),
    );
    const models = r.periods.flatMap((p) =>
      Object.entries(p.models).map(([name, m]) => [p.period + " " + p.id, name, String(m.requests), String(m.tokens), money(m.usd)]),
    );
    const limits = [
      ...r.periods.flatMap((p) => p.budgets.map((b) => [p.period + " " + p.id, b.unit, String(b.limit), String(b.used), String(b.remaining)])),
      ...r.rolling.map((b) => ["rolling " + b.window_s + " s", b.unit, String(b.limit), String(b.used), String(b.remaining)]),
    ];
    fill(
      out,
      el("h3", {}, "Spend of " + who + (r.shared ? "" : " (this replica's store only)")),
      table(["period", "id", "requests", "tokens", "USD", "reserved by running requests"], periods, { class: "spend" }),
      el("h3", {}, "By model"),
      models.length ? table(["period", "model", "requests", "tokens", "USD"], models) : el("p", { class: "dim" }, "Nothing spent in these periods."),
      el("h3", {}, "Budgets"),
      limits.length ? table(["period", "unit", "limit", "used", "remaining"], limits) : el("p", { class: "dim" }, "No budget for this scope."),
    );
    say("Spend of " + who + " read.");
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    fill(out, el("p", { class: "error", role: "alert" }, `No report (${err.status}): ${err.message}`));
  }
}
