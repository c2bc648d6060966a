// servemesh console: reads GET /v1/status every second and draws it. Every
// value from the API is written as text (textContent), never as markup.
"use strict";

const tokenKey = "servemesh-token";

function token() { return sessionStorage.getItem(tokenKey) || ""; }

async function call(method, path, body) {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.error || (method + " " + path + ": HTTP " + resp.status));
  return data;
}

// el makes an element with a class and text.
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const pct = (x) => (Math.round(x * 1000) / 10) + "%";
// partial is set while some node's figures could not be read: every rate
// then leaves it out, and says so with a "?".
let partial = false;
const rate = (x) => (Math.round(x * 10) / 10).toString() + (partial ? "?" : "");

function showError(msg) {
  const p = document.getElementById("error");
  p.textContent = msg;
  p.hidden = !msg;
}

function drawEndpoint(e, colors) {
  const box = el("div", "endpoint");
  box.id = "endpoint-" + e.name;
  box.append(el("h3", "", e.name + (e.route ? "  " + e.route : "  (headless)")));
  box.append(el("div", "muted", rate(e.request_rate) + " req/s, " + rate(e.error_rate) + " 5xx/s"));
  // An endpoint routed by model has a split per model (rows with .model).
  const models = [...new Set(e.backends.map((b) => b.model || ""))];
  for (const m of models) {
    if (m) box.append(el("div", "muted", "model " + m));
    box.append(splitBar(e.backends.filter((b) => (b.model || "") === m), colors));
  }
  const rows = el("table", "split");
  // A backend's rates are over every endpoint that sends it requests.
  const head = el("tr");
  for (const h of ["backend", "weight", "shadow", "backend's req/s", "backend's 5xx/s"]) head.append(el("th", "", h));
  head.lastChild.title = head.lastChild.previousSibling.title = "over every endpoint that sends the backend requests, not this one's alone";
  rows.append(el("thead"));
  rows.firstChild.append(head);
  for (const b of e.backends) {
    const tr = el("tr");
    tr.dataset.backend = b.backend;
    tr.append(el("td", "", b.model ? b.model + ": " + b.backend : b.backend),
      el("td", "weight", b.weight > 0 ? pct(b.weight) : ""),
      el("td", "shadow", b.shadow ? "mirrors " + pct(b.shadow) : ""),
      el("td", "", rate(b.request_rate) + " req/s"),
      el("td", b.error_rate > 0 ? "bad" : "", rate(b.error_rate) + " 5xx/s"));
    rows.append(tr);
  }
  box.append(rows);
  const limit = e.rate_limit && e.rate_limit.local;
  if (limit) {
    box.append(el("div", "muted rate-limit", "rate limit " + limit.requests_per_second + "/s each node" +
      (limit.header ? " per " + limit.header : "") + ", burst " + (limit.burst || limit.requests_per_second)));
  }
  const global = e.rate_limit && e.rate_limit.global;
  if (global) {
    box.append(el("div", "muted global-rate-limit", "global rate limit " + global.requests + "/" + (global.unit || "second") +
      " across the mesh" + (global.header ? " per " + global.header : global.client_address ? " per client address" : "") +
      (global.failure_mode === "closed" ? ", refuses" : ", lets through") + " while unchecked"));
  }
  const tokens = e.rate_limit && e.rate_limit.tokens;
  if (tokens) {
    box.append(el("div", "muted token-quota", "token quota " + tokens.tokens + "/" + (tokens.unit || "minute") +
      " across the mesh" + (tokens.header ? " per " + tokens.header : "")));
  }
  if (e.rollout) {
    const r = e.rollout;
    box.append(el("div", "rollout", "rollout of " + r.candidate + ": " + r.phase + (r.stage ? ", stage " + r.stage : "") + (r.reason ? " (" + r.reason + ")" : "")));
  }
  for (const m of models) box.append(splitForm(e, m)); // one form per split: the endpoint's, or each model's
  return box;
}

// splitBar draws one split's weights as a bar.
function splitBar(backends, colors) {
  const bar = el("div", "bar");
  bar.setAttribute("role", "img");
  const routed = backends.filter((b) => b.weight > 0);
  bar.setAttribute("aria-label", "split: " + routed.map((b) => b.backend + " " + pct(b.weight)).join(", "));
  for (const b of routed) {
    const seg = el("div", "segment " + colors(b.backend), b.backend + " " + pct(b.weight));
    seg.style.width = (b.weight * 100) + "%";
    bar.append(seg);
  }
  return bar;
}

// splitForm changes an endpoint's weights, or one model's of an endpoint
// routed by model (PUT .../traffic): the API's write scope decides whether
// it may.
function splitForm(e, model) {
  const form = el("form", "split-form");
  form.dataset.model = model;
  form.append(el("span", "muted", model ? "set " + model + "'s split: " : "set split: "));
  for (const b of e.backends) {
    if ((b.model || "") !== model || (b.weight === 0 && b.shadow)) continue;
    const label = el("label", "", b.backend + " ");
    const input = el("input");
    input.type = "number"; input.min = "0"; input.max = "1"; input.step = "0.01";
    input.name = b.backend; input.value = String(b.weight);
    label.append(input);
    form.append(label, " ");
  }
  form.append(el("button", "", "Apply"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const traffic = {};
    for (const input of form.querySelectorAll("input")) traffic[input.name] = Number(input.value);
    try {
      await call("PUT", "/v1/endpoints/" + encodeURIComponent(e.name) + "/traffic", model ? { traffic, model } : { traffic });
      showError("");
      document.activeElement.blur(); // done editing: draw the new split
      editing = false;
      refresh();
    } catch (err) {
      showError("changing " + e.name + "'s split: " + err.message);
    }
  });
  return form;
}

function drawBackends(backends) {
  const body = document.querySelector("#backends tbody");
  body.replaceChildren();
  for (const b of backends) {
    const tr = el("tr");
    tr.id = "backend-" + b.name;
    const byNode = {};
    for (const r of b.replicas || []) (byNode[r.node] = byNode[r.node] || []).push(r);
    const nodes = el("td");
    for (const [node, rs] of Object.entries(byNode)) {
      const line = el("div", "", node + ": ");
      for (const r of rs) {
        const s = el("span", r.ready ? "ok" : "bad", (r.ready ? "✓ " : "✗ ") + r.tag + (r.state !== "running" ? " (" + r.state + ")" : "") +
          (r.restarts ? " (restarted " + r.restarts + "×)" : "") + " ");
        if (r.note) s.title = r.note;
        line.append(s);
      }
      nodes.append(line);
    }
    tr.append(el("td", "", b.name + (b.autoscaled ? " (autoscaled)" : "")),
      el("td", "", b.ready + " / " + b.running + " / " + b.desired + (b.unheard ? ", " + b.unheard + " unheard" : "")),
      el("td", "", rate(b.request_rate)), el("td", b.error_rate > 0 ? "bad" : "", rate(b.error_rate)),
      el("td", "", rate(b.in_flight)), nodes);
    body.append(tr);
  }
}

function drawNodes(nodes) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of nodes) {
    const tr = el("tr");
    tr.id = "node-" + n.id;
    tr.append(el("td", "", n.id), el("td", n.connected ? "ok" : "bad", n.connected ? "yes" : "no"),
      el("td", n.in_sync ? "ok" : "bad", n.in_sync ? "✓ in sync" : (n.refused || "✗ behind")),
      el("td", n.nacks ? "bad" : "", String(n.nacks) + (n.last_nack ? ": " + n.last_nack : "")),
      el("td", n.figures_unread ? "bad figures" : "figures", n.figures_unread ? "? " + n.figures_unread : "read"),
      componentsCell(n));
    body.append(tr);
  }
}

// componentsCell is a node's own components, as its agent reports them:
// its rate limit service and its spans' exporter.
function componentsCell(n) {
  const failed = [];
  if (n.rate_limit_service) failed.push("✗ rate limit service: " + n.rate_limit_service);
  if (n.tracing) failed.push("✗ tracing: " + n.tracing);
  return el("td", failed.length ? "bad components" : "ok components", failed.length ? failed.join("; ") : "✓");
}

function drawProblems(problems) {
  document.getElementById("problems-section").hidden = problems.length === 0;
  const ul = document.getElementById("problems");
  ul.replaceChildren(...problems.map((p) => el("li", "", p)));
}

// colorsFor gives each backend one color across the page.
function colorsFor(status) {
  const names = [...new Set(status.backends.map((b) => b.name))].sort();
  return (name) => "c" + (Math.max(0, names.indexOf(name)) % 5);
}

let editing = false; // a split form with focus is not redrawn under the cursor

async function refresh() {
  let status;
  try {
    status = await call("GET", "/v1/status");
  } catch (err) {
    showError("reading /v1/status: " + err.message + (token() ? "" : " (enter a token above if the controller has tokens)"));
    return;
  }
  partial = status.nodes.some((n) => n.figures_unread);
  if (!editing) {
    const colors = colorsFor(status);
    document.getElementById("endpoints").replaceChildren(...status.endpoints.map((e) => drawEndpoint(e, colors)));
  }
  drawBackends(status.backends);
  drawNodes(status.nodes);
  drawProblems(status.problems);
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString() + ", rates over " + status.rate_window_s + " s" +
    (partial ? "; ?: without a node whose figures could not be read (see Nodes)" : "");
  if (document.getElementById("error").textContent.startsWith("reading")) showError("");
}

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(tokenKey, input.value.trim());
  input.value = "";
  refresh();
});
document.getElementById("endpoints").addEventListener("focusin", () => { editing = true; });
document.getElementById("endpoints").addEventListener("focusout", () => { editing = false; });

refresh();
setInterval(refresh, 1000);
