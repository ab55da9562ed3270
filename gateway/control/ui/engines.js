// The engine comparison: per model × pool × traffic class, TTFT and TPOT percentiles, error rate
// and output tokens/s over a window; which pool serves each class better; the rebalancing loop
// (GET /admin/engines/compare).
import { get } from "./api.js";
import { byId, el, fill, json, table, when } from "./dom.js";

let say = () => {};

export function init(status) {
  say = status;
  byId("engines-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    show();
  });
  byId("engines-window").addEventListener("change", show);
}

export function hide() {}

function ms(seconds) {
  return seconds === null || seconds === undefined ? "—" : (seconds * 1000).toFixed(1);
}

function num(value, attrs = {}) {
  return el("td", { class: "num", ...attrs }, value);
}

export async function show() {
  const query = new URLSearchParams({ window_s: byId("engines-window").value });
  const model = byId("engines-model").value.trim();
  if (model) query.set("model", model);
  const out = byId("engines-body");
  try {
    const r = await get("/admin/engines/compare?" + query.toString());
    const rows = r.rows.map((x) =>
      el(
        "tr",
        { "data-pool": x.pool, "data-class": x.traffic_class },
        el("td", {}, x.model),
        el("td", {}, x.pool),
        el("td", {}, x.traffic_class),
        num(String(x.requests), { "data-field": "requests" }),
        num((x.error_rate * 100).toFixed(1) + " %"),
        num(ms(x.ttft_p50_s)),
        num(ms(x.ttft_p90_s), { "data-field": "ttft_p90" }),
        num(ms(x.ttft_p99_s)),
        num(ms(x.tpot_p50_s)),
        num(ms(x.tpot_p90_s)),
        num(ms(x.tpot_p99_s)),
        num(String(x.output_tokens_per_s)),
        num(x.ttft_target_met === null ? "—" : (x.ttft_target_met * 100).toFixed(1) + " %"),
      ),
    );
    const better = r.better.map((b) =>
      el("li", { "data-better": b.better, "data-class": b.traffic_class }, `${b.model} · ${b.traffic_class}: ${b.why}`),
    );
    const loop = r.rebalance;
    const last = loop.last_round;
    fill(
      out,
      el("p", { class: "dim" }, `${r.scope === "fleet" ? "Every replica's requests" : r.note} Window: ${Math.round(r.span_s)} s. A verdict needs ${r.min_samples} requests of a class on each pool.`),
      rows.length
        ? table(
            ["model", "pool", "class", "requests", "error rate", "TTFT p50 ms", "p90", "p99", "TPOT p50 ms", "p90", "p99", "output tokens/s", "TTFT target met"],
            rows,
            { class: "engines" },
          )
        : el("p", { class: "dim" }, "No request reached an engine in this window."),
      el("h3", {}, "Which pool serves each class better"),
      better.length ? el("ul", { id: "engines-better" }, better) : el("p", { class: "dim" }, "Not enough requests on two pools of a model yet."),
      el("h3", {}, "Rebalancing"),
      el(
        "p",
        { id: "engines-loop" },
        !loop.enabled
          ? "Off (routing.rebalance)."
          : last
            ? `On. Last round ${when(last.at)} by ${last.replica}: ${last.moves.length ? last.moves.map((m) => m.why + " → " + json(m.after)).join("; ") : "no move (" + Object.entries(last.held).map(([k, v]) => k + ": " + v).join("; ") + ")"}.`
            : `On: a round every ${loop.interval_s} s; none yet.`,
      ),
    );
    say("Engine comparison read.");
  } catch (err) {
    if (err.status === 401 || err.status === 403) return;
    fill(out, el("p", { class: "error", role: "alert" }, `No comparison (${err.status}): ${err.message}`));
  }
}
