// The audit log: every admin change, newest first (GET /admin/audit).
import { get } from "./api.js";
import { byId, el, fill, json, table, when } from "./dom.js";

let say = () => {};

export function init(status) {
  say = status;
  byId("audit-refresh").addEventListener("click", show);
  byId("audit-limit").addEventListener("change", show);
}

export async function show() {
  try {
    const data = await get("/admin/audit?limit=" + encodeURIComponent(byId("audit-limit").value));
    const rows = data.entries.map((e) =>
      el(
        "tr",
        { "data-action": e.action },
        el("td", { class: "mono" }, when(e.ts)),
        el("td", {}, json(e.actor)),
        el("td", {}, json(e.action)),
        el("td", {}, json(e.target)),
        el("td", { class: "mono" }, json(e.before)),
        el("td", { class: "mono" }, json(e.after)),
      ),
    );
    fill(
      byId("audit-body"),
      rows.length ? table(["time (UTC)", "actor", "action", "target", "before", "after"], rows, { class: "audit" }) : el("p", { class: "dim" }, "No admin changes yet."),
    );
  } catch (err) {
    if (err.status !== 401 && err.status !== 403) say("Could not read the audit log: " + err.message, "error");
  }
}

export function hide() {}
