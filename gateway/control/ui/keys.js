// API keys: list, create (the secret shown once, never stored), revoke.
import { del, get, post, seg } from "./api.js";
import { byId, el, fill, json, list, table, when } from "./dom.js";

let say = () => {};

export function init(status) {
  say = status;
  byId("key-form").addEventListener("submit", create);
  byId("key-add-budget").addEventListener("click", () => byId("key-budgets").append(budgetRow()));
  byId("new-key-done").addEventListener("click", forgetSecret);
  byId("new-key-copy").addEventListener("click", copySecret);
}

export function show() {
  load();
}

export function hide() {
  forgetSecret();
}

/** The new key leaves the page: the field is emptied and the panel hidden. */
function forgetSecret() {
  byId("new-key-value").value = "";
  byId("new-key").hidden = true;
}

async function copySecret() {
  const field = byId("new-key-value");
  field.focus();
  field.select();
  try {
    await navigator.clipboard.writeText(field.value);
    say("Copied the new key to the clipboard.");
  } catch {
    say("The browser refused the clipboard: the key is selected, copy it with Ctrl-C.", "error");
  }
}

function budgetRow() {
  const period = el("select", { "data-budget": "period", "aria-label": "budget period" }, ["day", "month", "rolling"].map((p) => el("option", { value: p }, p)));
  const windowS = el("input", { type: "number", min: "60", step: "1", placeholder: "window s (rolling)", "data-budget": "window_s", "aria-label": "rolling window in seconds" });
  const usd = el("input", { type: "number", min: "0", step: "any", placeholder: "USD", "data-budget": "usd", "aria-label": "budget in USD" });
  const tokens = el("input", { type: "number", min: "1", step: "1", placeholder: "tokens", "data-budget": "tokens", "aria-label": "budget in tokens" });
  const row = el("div", { class: "budget" }, period, windowS, usd, tokens);
  row.append(el("button", { type: "button", onclick: () => row.remove() }, "remove"));
  return row;
}

function budgets() {
  return [...byId("key-budgets").querySelectorAll(".budget")].map((row) => {
    const value = (name) => row.querySelector(`[data-budget="${name}"]`).value.trim();
    const out = { period: value("period") };
    if (value("window_s")) out.window_s = Number(value("window_s"));
    if (value("usd")) out.usd = Number(value("usd"));
    if (value("tokens")) out.tokens = Number(value("tokens"));
    return out;
  });
}

async function create(ev) {
  ev.preventDefault();
  forgetSecret();
  const text = (id) => byId(id).value.trim();
  const body = {
    user: text("key-user"),
    tier: byId("key-tier").value || undefined,
    name: text("key-name"),
    roles: list(text("key-roles")),
    deny_models: list(text("key-deny")),
    budgets: budgets(),
  };
  if (text("key-tenant")) body.tenant = text("key-tenant");
  if (text("key-allow")) body.allow_models = list(text("key-allow"));
  try {
    const created = await post("/admin/api-keys", body);
    byId("new-key-value").value = created.key;
    byId("new-key").hidden = false;
    byId("new-key-value").select();
    byId("key-form").reset();
    byId("key-budgets").replaceChildren();
    say(`Created API key ${created.id} for ${created.user}: copy it now, it is not shown again.`);
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    say("The key was not created: " + err.message, "error");
  }
  load();
}

/** The tier select offers the configured tiers, the default one chosen unless another already is. */
function tierChoices(tiers, chosen) {
  const select = byId("key-tier");
  const keep = tiers.includes(select.value) ? select.value : chosen;
  select.replaceChildren(...tiers.map((t) => el("option", { value: t }, t === chosen ? `${t} (default)` : t)));
  select.value = keep;
}

async function load() {
  try {
    const data = await get("/admin/api-keys");
    tierChoices(data.tiers, data.default_tier);
    const rows = data.keys.map((k) => {
      const revoke = el("button", { type: "button", class: "danger", "data-revoke": k.id }, "Revoke");
      let armed = null;
      revoke.addEventListener("click", () => {
        if (!armed) {  // a second click within 5 s confirms
          revoke.textContent = "Confirm revoke";
          revoke.classList.add("armed");
          armed = setTimeout(() => {
            armed = null;
            revoke.textContent = "Revoke";
            revoke.classList.remove("armed");
          }, 5000);
          return;
        }
        clearTimeout(armed);
        revokeKey(k.id);
      });
      const grants = [
        k.allow_models === null ? "" : "allow " + k.allow_models.join(", "),
        k.deny_models.length ? "deny " + k.deny_models.join(", ") : "",
      ].filter(Boolean);
      const spending = k.budgets.map((b) => `${b.usd !== undefined ? "$" + b.usd : b.tokens + " tokens"} / ${b.period === "rolling" ? b.window_s + " s" : b.period}`);
      return el(
        "tr",
        { "data-key": k.id },
        el("td", { class: "mono" }, k.id),
        el("td", { class: "mono" }, k.hint),
        el("td", {}, k.user),
        el("td", {}, json(k.tenant)),
        el("td", {}, k.tier),
        el("td", {}, k.roles.join(", ")),
        el("td", {}, k.name),
        el("td", { class: "mono" }, when(k.created)),
        el("td", {}, grants.join("; ") || "tier and tenant"),
        el("td", {}, spending.join("; ") || "—"),
        el("td", {}, revoke),
      );
    });
    fill(
      byId("keys-body"),
      rows.length ? table(["id", "hint", "user", "tenant", "tier", "roles", "label", "created (UTC)", "models", "budgets", ""], rows, { class: "keys" }) : el("p", { class: "dim" }, "No API keys."),
    );
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    fill(byId("keys-body"), el("p", { class: "error" }, "Could not list the keys: " + err.message));
  }
}

async function revokeKey(id) {
  try {
    await del(`/admin/api-keys/${seg(id)}`);
    say(`Revoked API key ${id}: it is refused from now on.`);
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    say(`Key ${id}: ${err.message}`, "error");
  }
  load();
}
