// The admin REST API, called with the operator's token from sessionStorage. A 401 or 403 goes back
// to the token prompt (the handler console.js registers); other errors are thrown as ApiError with
// the gateway's own message.

const TOKEN = "gateway.admin.token";

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let onDenied = () => {};

/** `handler(error)` runs when the gateway refuses the token (401 or 403). */
export function onAuthFailure(handler) {
  onDenied = handler;
}

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN, value);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN);
}

/**
 * `method path` with the token; `body` an object (sent as JSON) or `raw` a string sent as it is.
 * Resolves to the parsed answer; rejects with ApiError.
 */
export async function call(method, path, { body, raw, headers = {} } = {}) {
  const current = token();
  if (!current) {
    const err = new ApiError(401, "Sign in with an admin token.", null);
    onDenied(err);
    throw err;
  }
  const init = {
    method,
    headers: { Authorization: "Bearer " + current, Accept: "application/json", ...headers },
    cache: "no-store",
    credentials: "omit",
    redirect: "error",
  };
  if (raw !== undefined || body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = raw !== undefined ? raw : JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "The gateway did not answer (" + e.message + ").", null);
  }
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const e = data && data.error ? data.error : {};
    const err = new ApiError(resp.status, e.message || resp.statusText || "request failed", e.code || null);
    if (resp.status === 401 || resp.status === 403) onDenied(err);
    throw err;
  }
  return data;
}

export const get = (path) => call("GET", path);
export const put = (path, body) => call("PUT", path, { body });
export const post = (path, body) => call("POST", path, { body });
export const del = (path) => call("DELETE", path);

/** A path segment, escaped (pool, backend and key names go into URLs). */
export const seg = (s) => encodeURIComponent(s);
