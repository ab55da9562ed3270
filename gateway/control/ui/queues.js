// Flow control's queues (GET /admin/flow): the classes, what waits in this replica and why requests
// were shed, the saturated backends, and every replica's waiting requests. Refreshed every two
// seconds while this tab is shown and the page is visible.
import { get } from "./api.js";
import { byId, el, fill, json, table } from "./dom.js";
import { refresher } from "./refresh.js";

const EVERY_MS = 2000;
const REASONS = ["deadline", "full", "share", "disconnect"];
const tab = refresher(load, EVERY_MS);
let say = () => {};

export function init(status) {
  say = status;
}

export const show = () => tab.show();
export const hide = () => tab.hide();

async function load() {
  tab.loading();
  try {
    const data = await get("/admin/flow");
    if (!tab.shown) return;
    render(data);
    byId("queues-updated").textContent =
      "updated " + new Date().toLocaleTimeString() + (data.shared ? " · every replica (Redis)" : " · this replica only");
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    say("Could not read the queues: " + err.message, "error");
  }
  tab.schedule();
}

function render(data) {
  const here = data.replica || { queued: {}, oldest_wait_s: {}, shed: {}, saturated_backends: [] };
  const classes = Object.entries(data.classes).map(([name, c]) => {
    const shed = here.shed[name] || {};
    return el(
      "tr",
      { "data-class": name },
      el("td", {}, name),
      el("td", {}, String(c.priority)),
      el("td", {}, String(c.max_queue_s)),
      el("td", {}, String(c.max_queued)),
      el("td", {}, json(c.ttft_target_s)),
      el("td", {}, json(c.max_kv_use)),
      el("td", { class: "queued" }, String(here.queued[name] || 0)),
      el("td", {}, json(here.oldest_wait_s[name])),
      REASONS.map((r) => el("td", {}, String(shed[r] || 0))),
    );
  });
  const columns = ["class", "priority", "max queue (s)", "max queued", "TTFT target (s)", "KV use at most", "waiting here", "oldest wait (s)"];
  const saturated = here.saturated_backends.length ? here.saturated_backends.join(", ") : "none";
  const replicas = (data.replicas || []).map((r) => [r.process, json(r.queued)]);
  fill(
    byId("queues-body"),
    el("p", {}, data.enabled ? "Flow control is on: requests wait here only while their backends are saturated." : "Flow control is off: every request passes through."),
    table([...columns, ...REASONS.map((r) => "shed: " + r)], classes, { class: "queues" }),
    el("p", {}, "Saturated backends: ", el("span", { id: "queues-saturated" }, saturated)),
    replicas.length ? table(["replica", "waiting by class"], replicas) : null,
  );
}
