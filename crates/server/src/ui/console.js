// The sluice operator console: polls GET /v1/stats every second and renders it. Every value
// shown comes from the server and is inserted as text (never as HTML): identities are chosen
// by clients and must not be able to run script here.
"use strict";

const TOKEN_KEY = "sluice.admin_token";
const POLL_MS = 1000;
const SVG_NS = "http://www.w3.org/2000/svg";
let timer = null;
let lastStats = null;

function $(id) { return document.getElementById(id); }

function token() { return sessionStorage.getItem(TOKEN_KEY); }

// A token link (/ui#token=...) logs in and leaves the address bar at once: the fragment never
// reached the server, and it should not stay in the history either.
function takeTokenFromFragment() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

async function api(method, path, body) {
  const headers = {};
  const t = token();
  if (t) headers["Authorization"] = "Bearer " + t;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method, headers, cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let json = null;
  try { json = await res.json(); } catch (_) { /* no body */ }
  return { status: res.status, json };
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  if (typeof n === "number" && !Number.isInteger(n)) return n.toFixed(n < 10 ? 2 : 1);
  return Number(n).toLocaleString("en-US");
}

function ms(v) { return v === null || v === undefined ? "–" : fmt(v) + " ms"; }

function when(unixMs) {
  if (!unixMs) return "never";
  const left = Math.round((unixMs - Date.now()) / 1000);
  if (left <= 0) return "now";
  if (left < 120) return "in " + left + " s";
  if (left < 7200) return "in " + Math.round(left / 60) + " min";
  return "in " + Math.round(left / 3600) + " h";
}

function showLogin(message) {
  stopPolling();
  $("console").hidden = true;
  $("logout").hidden = true;
  $("breaker").hidden = true;
  $("summary").textContent = "";
  for (const id of ["policies", "store", "reload", "reload-errors"]) $(id).replaceChildren();
  for (const id of ["top-decisions", "top-denials", "bans", "overrides", "lists"]) {
    $(id).tBodies[0].replaceChildren();
    delete $(id).tBodies[0].dataset.key;
  }
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

function stopPolling() {
  if (timer !== null) { clearInterval(timer); timer = null; }
}

async function poll() {
  let r;
  try {
    r = await api("GET", "/v1/stats");
  } catch (e) {
    $("status").textContent = "The server does not answer (" + e.message + "); retrying.";
    return false;
  }
  if (r.status === 401) {
    const hadToken = token() !== null;
    sessionStorage.removeItem(TOKEN_KEY);
    lastStats = null;
    showLogin(hadToken ? "The token was refused." : "");
    return false;
  }
  if (r.status !== 200 || !r.json) {
    $("status").textContent = "GET /v1/stats answered " + r.status + "; retrying.";
    return false;
  }
  lastStats = r.json;
  $("login").hidden = true;
  $("console").hidden = false;
  $("logout").hidden = token() === null;
  $("status").textContent = "Updated " + new Date().toLocaleTimeString() + ".";
  render(r.json);
  return true;
}

function startPolling() {
  stopPolling();
  poll();
  timer = setInterval(poll, POLL_MS);
}

// ---- rendering -------------------------------------------------------------------------

function render(s) {
  $("summary").textContent =
    "generation " + s.generation + " · store " + s.store.kind + " · up " + fmt(s.uptime_s) + " s";
  const b = $("breaker");
  b.hidden = false;
  b.textContent = "breaker " + s.store.breaker;
  b.className = "badge " + (s.store.breaker === "closed" ? "ok" : "bad");
  renderPolicies(s.policies, s.uptime_s);
  renderStore(s.store);
  renderReload(s);
  renderTop("top-decisions", s.top.decisions);
  renderTop("top-denials", s.top.denials);
  renderControl(s.control);
  renderPolicyChoice(s.configured_policies);
}

function polyline(values, max, w, h, cls) {
  const step = values.length > 1 ? w / (values.length - 1) : w;
  const pts = values.map((v, i) => (i * step).toFixed(1) + "," + (h - (v / max) * (h - 2) - 1).toFixed(1));
  const p = document.createElementNS(SVG_NS, "polyline");
  p.setAttribute("class", "line " + cls);
  p.setAttribute("points", pts.join(" "));
  return p;
}

// The chart spans the seconds since the server started, up to the five minutes kept (and at
// least 30 s), so a young server's traffic is not squeezed against the right edge.
function chart(all, uptime) {
  // The last value is the second in progress: left out, or every chart would end in a dip.
  const span = Math.min(all.decisions.length - 1, Math.max(30, uptime));
  const series = {};
  for (const [k, v] of Object.entries(all)) series[k] = v.slice(v.length - 1 - span, v.length - 1);
  const w = 300, h = 70;
  const failed = series.failed_open.map((v, i) => v + series.failed_closed[i]);
  const max = Math.max(1, ...series.decisions);
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "decisions and denials per second over the last " + span + " s, peak " + max);
  const axis = document.createElementNS(SVG_NS, "line");
  axis.setAttribute("class", "axis");
  axis.setAttribute("x1", 0); axis.setAttribute("x2", w);
  axis.setAttribute("y1", h - 0.5); axis.setAttribute("y2", h - 0.5);
  svg.append(axis,
    polyline(series.decisions, max, w, h, "decisions"),
    polyline(series.shadow_denied, max, w, h, "shadow_denied"),
    polyline(failed, max, w, h, "failed"),
    polyline(series.denied, max, w, h, "denied"));
  return svg;
}

function renderPolicies(policies, uptime) {
  const root = $("policies");
  if (policies.length === 0) {
    root.replaceChildren(el("p", { class: "muted" }, "No policies yet."));
    return;
  }
  const cards = policies.map((p) => {
    const t = p.totals;
    const counts = el("ul", { class: "counts" },
      el("li", {}, el("span", { class: "swatch decisions" }), "decisions ", el("b", { class: "total-decisions" }, fmt(t.decisions))),
      el("li", {}, "allowed ", el("b", { class: "total-allowed" }, fmt(t.allowed))),
      el("li", {}, el("span", { class: "swatch denied" }), "denied ", el("b", { class: "total-denied" }, fmt(t.denied))),
      el("li", {}, el("span", { class: "swatch shadow_denied" }), "shadow-denied ", el("b", {}, fmt(t.shadow_denied))),
      el("li", {}, el("span", { class: "swatch failed" }), "failed open ", el("b", {}, fmt(t.failed_open))),
      el("li", {}, "failed closed ", el("b", {}, fmt(t.failed_closed))));
    return el("article", { class: "card policy", "data-policy": p.policy },
      el("div", { class: "head" },
        el("h3", {}, p.policy),
        el("span", {}, el("span", { class: "rate" }, fmt(p.decisions_per_s)), el("span", { class: "muted small" }, " /s"))),
      chart(p.series, uptime),
      counts,
      el("p", { class: "muted small" }, "decision p50 " + ms(p.latency_ms.p50) + " · p99 " + ms(p.latency_ms.p99)));
  });
  root.replaceChildren(...cards);
}

function facts(root, pairs) {
  root.replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function renderStore(st) {
  facts($("store"), [
    ["kind", st.kind],
    ["breaker", st.breaker],
    ["latency p50", ms(st.latency_ms.p50)],
    ["latency p99", ms(st.latency_ms.p99)],
    ["calls (" + st.window_s + " s)", fmt(st.calls)],
    ["errors (" + st.window_s + " s)", fmt(st.errors)],
  ]);
}

function renderReload(s) {
  const r = s.last_reload;
  facts($("reload"), [
    ["generation", fmt(s.generation)],
    ["last reload", r ? (r.ok ? "ok" : "failed") + " (" + r.trigger + ", " + new Date(r.at_ms).toLocaleTimeString() + ")" : "none since start"],
    ["control entries", s.control.backend],
  ]);
  $("reload-errors").replaceChildren(...(r && !r.ok ? r.errors.map((e) => el("li", {}, e)) : []));
}

function actionButton(label, onClick) {
  const b = el("button", { type: "button" }, label);
  b.addEventListener("click", onClick);
  return b;
}

// Rows are rebuilt only when their data changed, so a button is not replaced under the
// pointer between two polls.
function rows(table, items, cells, emptyText) {
  const body = $(table).tBodies[0];
  const key = JSON.stringify(items);
  if (body.dataset.key === key) return;
  body.dataset.key = key;
  if (items.length === 0) {
    const cols = $(table).tHead.rows[0].cells.length;
    body.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: cols }, emptyText)));
    return;
  }
  body.replaceChildren(...items.map((it) => el("tr", {}, ...cells(it))));
}

function renderTop(table, list) {
  rows(table, list, (c) => [
    el("td", { class: "identity" }, c.identity),
    el("td", { class: "num" }, fmt(c.count)),
    el("td", { class: "num" }, fmt(c.error)),
    el("td", { class: "act" }, actionButton("Ban 10m", () => act("POST", "/v1/bans", { identity: c.identity, duration: "10m" }, "banned " + c.identity))),
  ], "nothing yet");
}

function renderControl(c) {
  rows("bans", c.bans, (b) => [
    el("td", { class: "identity" }, b.identity),
    el("td", {}, b.policies ? b.policies.join(", ") : "every policy"),
    el("td", {}, when(b.until_ms)),
    el("td", { class: "act" }, actionButton("Lift", () => act("DELETE", "/v1/bans", { identity: b.identity }, "lifted the ban of " + b.identity))),
  ], "no bans");
  rows("overrides", c.overrides, (o) => [
    el("td", {}, o.policy),
    el("td", { class: "identity" }, o.identity),
    el("td", {}, o.target),
    el("td", {}, o.expires_at_ms ? when(o.expires_at_ms) : "until removed"),
    el("td", { class: "act" }, actionButton("Remove", () => act("DELETE", "/v1/overrides", { policy: o.policy, identity: o.identity }, "removed the override"))),
  ], "no overrides");
  rows("lists", c.lists, (e) => [
    el("td", {}, e.list),
    el("td", { class: "identity" }, e.entry),
    el("td", {}, e.expires_at_ms ? when(e.expires_at_ms) : "until removed"),
    el("td", { class: "act" }, e.from_config ? el("span", { class: "muted small" }, "in the file")
      : actionButton("Remove", () => act("DELETE", "/v1/lists/" + e.list, { entry: e.entry }, "removed " + e.entry))),
  ], "no entries");
}

function renderPolicyChoice(policies) {
  const sel = $("try-policy");
  const names = policies.map((p) => p.name);
  const have = Array.from(sel.options).map((o) => o.value);
  if (names.join("\n") === have.join("\n")) return;
  const chosen = sel.value;
  sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (names.includes(chosen)) sel.value = chosen;
}

// ---- actions ---------------------------------------------------------------------------

async function act(method, path, body, done) {
  const out = $("action-result");
  try {
    const r = await api(method, path, body);
    out.textContent = r.status === 200 ? "Done: " + done + "."
      : method + " " + path + ": " + (r.json && r.json.detail ? r.json.detail : "status " + r.status);
  } catch (e) {
    out.textContent = method + " " + path + " failed: " + e.message;
  }
  poll();
}

async function tryCheck(method) {
  const body = { policy: $("try-policy").value, identity: $("try-identity").value.trim() };
  if (!body.policy || !body.identity) return;
  const r = await api(method, "/v1/state", body);
  $("try-answer").hidden = false;
  const v = $("try-verdict");
  const j = r.json || {};
  if (r.status !== 200) {
    v.className = "verdict denied";
    v.textContent = "Error " + r.status + ": " + (j.detail || "");
    $("try-headers").textContent = "";
    return;
  }
  if (method === "DELETE") {
    v.className = "verdict";
    v.textContent = j.existed ? "Reset: the bucket is full again." : "Nothing to reset: the bucket was untouched.";
    $("try-headers").textContent = "";
    return;
  }
  v.className = "verdict " + (j.allowed ? "allowed" : "denied");
  v.textContent = (j.allowed ? "A check now would be allowed" : "A check now would be denied") +
    ": " + j.remaining + " of " + j.limit + " left.";
  const lines = [
    "RateLimit: \"" + j.policy + "\";r=" + j.remaining + ";t=" + Math.ceil(j.reset_after_ms / 1000),
    "RateLimit-Policy: \"" + j.policy + "\";q=" + j.limit,
  ];
  if (!j.allowed) lines.push("Retry-After: " + Math.ceil(j.retry_after_ms / 1000));
  $("try-headers").textContent = lines.join("\n");
}

function wire() {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    $("token").value = "";
    $("login-error").textContent = "";
    startPolling();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    lastStats = null;
    showLogin("");
  });
  $("ban-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const identity = $("ban-identity").value.trim();
    const duration = $("ban-duration").value.trim();
    if (identity) act("POST", "/v1/bans", { identity, duration }, "banned " + identity + " for " + duration);
  });
  $("try-form").addEventListener("submit", (ev) => { ev.preventDefault(); tryCheck("POST"); });
  $("try-reset").addEventListener("click", () => tryCheck("DELETE"));
}

takeTokenFromFragment();
wire();
startPolling();
