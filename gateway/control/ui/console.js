// The admin console's entry point: the token prompt, the tabs, the status line.
import { clearToken, get, onAuthFailure, setToken, token } from "./api.js";
import { byId } from "./dom.js";
import * as audit from "./audit.js";
import * as engines from "./engines.js";
import * as explain from "./explain.js";
import * as fleet from "./fleet.js";
import * as keys from "./keys.js";
import * as queues from "./queues.js";
import * as spend from "./spend.js";

const SCREENS = { fleet, explain, keys, queues, spend, engines, audit };
let current = null;

/** The status line: what the last action did (`kind` "ok" or "error"). */
export function status(text, kind = "ok") {
  const line = byId("status");
  line.textContent = text;
  line.className = "status " + kind;
}

function signedIn(yes) {
  byId("login").hidden = yes;
  byId("tabs").hidden = !yes;
  byId("signout").hidden = !yes;
  if (!yes) {
    for (const [name, screen] of Object.entries(SCREENS)) {
      byId(name).hidden = true;
      screen.hide();
    }
    current = null;
  }
}

function showLogin(message) {
  clearToken();
  signedIn(false);
  byId("login-error").textContent = message || "";
  status("");
  byId("token").focus();
}

function route() {
  if (!token()) return;
  const name = location.hash.slice(1) in SCREENS ? location.hash.slice(1) : "fleet";
  if (current && current !== name) SCREENS[current].hide();
  for (const key of Object.keys(SCREENS)) byId(key).hidden = key !== name;
  for (const a of document.querySelectorAll("#tabs a")) {
    a.classList.toggle("active", a.dataset.tab === name);
  }
  if (current !== name) status("");
  current = name;
  SCREENS[name].show(status);
}

async function signIn(value) {
  setToken(value);
  try {
    await get("/admin/pools"); // the token must pass the admin guard before any screen shows
  } catch (err) {
    if (err.status !== 401 && err.status !== 403) showLogin("The gateway did not accept the sign-in: " + err.message);
    return;
  }
  byId("login-error").textContent = "";
  signedIn(true);
  route();
}

onAuthFailure((err) => {
  const why = err.status === 403 ? "this token has no admin role" : "the token is missing, malformed, expired or unknown";
  showLogin(`Refused by the gateway (${err.status}: ${why}): ${err.message}`);
});

document.addEventListener("DOMContentLoaded", () => {
  byId("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = byId("token");
    const value = input.value.trim();
    input.value = "";
    if (value) signIn(value);
  });
  byId("signout").addEventListener("click", () => showLogin("Signed out."));
  window.addEventListener("hashchange", route);
  for (const screen of Object.values(SCREENS)) screen.init(status);
  const saved = token();
  if (saved) signIn(saved);
  else showLogin("");
});
