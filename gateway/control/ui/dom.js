// DOM helpers. Every value from the gateway is written with textContent (text nodes): this console
// never parses data as HTML.

/** An element with attributes (`on*` functions become listeners) and children (strings become text). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      node.className = value;
    } else if (value === true) {
      node.setAttribute(name, "");
    } else {
      node.setAttribute(name, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace the children of `node` with `children`. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

export function byId(id) {
  return document.getElementById(id);
}

/** A table: `columns` header names, `rows` arrays of cells (strings or nodes). */
export function table(columns, rows, attrs = {}) {
  return el(
    "table",
    attrs,
    columns.length ? el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c)))) : null,
    el("tbody", {}, rows.map((r) => (r instanceof Node ? r : el("tr", {}, r.map((c) => el("td", {}, c)))))),
  );
}

/** A compact JSON rendering of a value for a table cell ("—" for null). */
export function json(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "string") return value;
  return JSON.stringify(value);
}

/** A comma-separated list as an array of trimmed, non-empty strings. */
export function list(text) {
  return text
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

export function when(ts) {
  if (typeof ts !== "number") return json(ts);
  return new Date(ts * 1000).toISOString().replace(".000Z", "Z");
}
