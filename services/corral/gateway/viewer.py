"""The session viewer: one self-contained page, served by the gateway, for a live or recorded session.

A timeline to scrub through the frames, the list of actions, and for the chosen action what it
was, how it went and the network requests it caused (from the egress audit log); a command shows
its command, cwd, exit code, duration and recorded output, a file operation its path, size and
sha256 (all of it the sandbox's text, so only ever set as text, never parsed as HTML). It is opened as
``viewer#token=<API key or session token>``: the fragment never leaves the browser, and the page
sends the credential only as an ``Authorization`` header on its own fetches, so it appears in no
URL, server log or Referer. Frames come through ``fetch`` too (an ``<img>`` cannot send a header)
and are shown from ``blob:`` URLs. While the session lives the page asks for the events after the
last one it has, one request at a time, and stops once the recording says it has ended.
"""

from __future__ import annotations

import html
import json
import secrets
from typing import NamedTuple

POLL_MS = 2000  # between the end of one events request and the start of the next

# Sent with the page and with the redirect from an old ``?token=`` link.
VIEWER_HEADERS: dict[str, str] = {
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}

_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src 'self' blob:; "
    "connect-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<title>Corral session __TITLE__</title>
<style nonce="__NONCE__">
body{margin:0;font:13px sans-serif;display:grid;grid-template-columns:300px 1fr;height:100vh}
#actions{overflow:auto;border-right:1px solid #ccc;margin:0;padding:0;list-style:none}
#actions li{padding:4px 8px;cursor:pointer;border-bottom:1px solid #eee}
#actions li.failed{color:#b00}#actions li.current{background:#def}
main{padding:8px;overflow:auto}#frame{max-width:100%;border:1px solid #ccc}
#timeline{width:100%}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
.deny{color:#b00}.report{color:#a60}.secret{color:#05a}#status{color:#666}
#result th{width:8em}#result pre{background:#f6f6f6;border:1px solid #ddd;padding:4px;max-height:20em;overflow:auto;
white-space:pre-wrap;word-break:break-all}#result .note{color:#666;font-style:italic}#result .bad{color:#b00}
</style></head><body>
<ul id="actions"></ul>
<main>
<h1 id="heading">Session __TITLE__</h1>
<p id="status" role="status"></p>
<input id="timeline" type="range" min="1" max="1" value="1" aria-label="timeline">
<p id="position"></p>
<img id="frame" alt="frame after the action">
<div id="result"></div>
<h2>Action</h2><pre id="details"></pre>
<h2>Network requests</h2>
<table><thead><tr><th>seq</th><th>event</th><th>decision</th><th>method</th><th>url / host</th><th>status</th>
<th>rule</th></tr></thead><tbody id="network"></tbody></table>
</main>
<script nonce="__NONCE__">
"use strict";
const session = __SESSION__;
const POLL_MS = __POLL_MS__;
// The credential is in the fragment, which the browser never sends; it goes out only as a header.
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const base = "/v1/sessions/" + encodeURIComponent(session);
let actions = [], current = 0, after = 0, shown = 0, frameUrl = null;

function get(path, cache) {
  return fetch(base + path, {headers: {Authorization: "Bearer " + token}, cache: cache || "default"});
}

function setStatus(text) { document.getElementById("status").textContent = text; }

async function reason(response) {
  try {
    const error = (await response.json()).error;
    return error.code + " (" + error.message + ")";
  } catch (_) {
    return String(response.status);
  }
}

// Commands and file operations (docs/recording.md): what the agent ran or touched, read from the
// recorded request and reply. All of it is the sandbox's text: it only ever goes in as textContent.
const UPLOADS = ["content", "content_base64", "data", "data_base64", "stdin", "stdin_base64"];

function actionOf(a) {
  const n = a.native || [];
  if (n.length) return n[n.length - 1] || {};
  return (a.request && typeof a.request === "object" && a.request.action) || {};
}

function resultOf(a) { return (a.reply && a.reply.result) || {}; }

function commandText(act) {
  if (typeof act.command === "string") return act.command;
  return JSON.stringify(act.argv || []);
}

function ended(r) {
  if (r.background) return "pid " + r.pid + ", in the background";
  if (r.timed_out) return "timed out" + (r.signal ? " (" + r.signal + ")" : "");
  if (r.exit_code !== null && r.exit_code !== undefined) return "exit " + r.exit_code;
  return r.signal ? "killed by " + r.signal : "";
}

function summary(a) {
  const act = actionOf(a), r = resultOf(a);
  if (act.type === "exec") return "exec " + commandText(act).slice(0, 80) + (a.ok ? " \\u2192 " + ended(r) : "");
  if (typeof act.type === "string" && act.type.startsWith("file_") && (act.path || act.source)) {
    const size = typeof r.size === "number" ? " (" + r.size + " bytes)" : "";
    return act.type + " " + (act.path || act.source + " \\u2192 " + act.destination) + size;
  }
  const n = (a.native || [])[0] || {};
  const parts = Object.entries(n).filter(([k, v]) => k !== "type" && !UPLOADS.includes(k) && typeof v !== "object");
  return (n.type || a.dialect || "request") + " " + parts.slice(0, 3).map(([k, v]) => k + "=" + v).join(" ");
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function facts(rows) {
  const table = el("table");
  for (const [name, value] of rows) {
    if (value === undefined || value === null || value === "") continue;
    const tr = el("tr");
    tr.append(el("th", name), el("td", String(value)));
    table.appendChild(tr);
  }
  return table;
}

// What the recording kept of a payload: all of it, or its first bytes, with its size and sha256.
function kept(a, path, text, ownCut) {
  const p = (a.payloads || {})[path] || null;
  const notes = [];
  if (p && p.truncated) notes.push("recorded: the first " + text.length + " characters of " + p.size + " bytes");
  else if (p) notes.push(p.size + " bytes");
  if (p) notes.push("sha256 " + p.sha256);
  if (ownCut) notes.push("the command's output was cut at max_output_bytes");
  return notes.join("; ");
}

function output(box, a, name, path, text, ownCut) {
  if (typeof text !== "string") return;
  box.append(el("h3", name), el("p", kept(a, path, text, ownCut), "note"), el("pre", text, "output " + name));
}

function showCommand(box, a, act, r) {
  box.appendChild(el("h2", act.type === "exec" ? "Command" : "Process"));
  box.appendChild(facts([
    [typeof act.command === "string" ? "command" : "argv", act.type === "exec" ? commandText(act) : ""],
    ["cwd", act.type === "exec" ? (act.cwd || "/workspace") : ""],
    // Names only: the recording keeps no env value (each is its size and sha256).
    ["env", act.env && typeof act.env === "object" ? Object.keys(act.env).join(" ") : ""],
    ["pid", r.pid ?? act.pid], ["exit code", r.exit_code], ["signal", r.signal],
    ["timed out", r.timed_out ? "yes" : ""], ["running", r.running === undefined ? "" : String(r.running)],
    ["duration", typeof r.duration_ms === "number" ? r.duration_ms + " ms" : ""],
  ]));
  output(box, a, "stdout", "reply.result.stdout", r.stdout, r.stdout_truncated);
  output(box, a, "stderr", "reply.result.stderr", r.stderr, r.stderr_truncated);
  output(box, a, "output", "reply.result.data", r.data, false);
  for (const field of ["stdin", "stdin_base64", "data", "data_base64"]) {
    const p = (a.payloads || {})["request.action." + field];
    if (p) box.appendChild(el("p", field + " sent: " + p.size + " bytes, sha256 " + p.sha256, "note"));
  }
}

function showFile(box, a, act, r) {  // file_* actions, and file_upload/file_download over HTTP
  const uploaded = (a.payloads || {})["request.action.content"] || (a.payloads || {})["request.action.content_base64"];
  box.appendChild(el("h2", "File"));
  box.appendChild(facts([
    ["path", r.path || act.path], ["source", act.source], ["destination", act.destination],
    // A file moved over HTTP (PUT/GET /v1/files): which way, and whether the whole of it went.
    ["direction", r.direction ? r.direction + " over HTTP" : ""],
    ["sent as", r.direction && r.type === "directory" ? "a tar of the directory (size and sha256 are the tar's)" : ""],
    ["complete", r.complete === false ? "no: " + (r.cut || "cut short") : ""],
    ["size", typeof r.size === "number" ? r.size + " bytes" : (uploaded ? uploaded.size + " bytes" : "")],
    ["sha256", r.sha256 || (uploaded && uploaded.sha256)],
    ["entries", Array.isArray(r.entries) ? r.entries.length + (r.truncated ? " (more not listed)" : "") : ""],
  ]));
  output(box, a, "content", "reply.result.content", r.content, false);
}

function showResult(a) {
  const box = document.getElementById("result");
  box.replaceChildren();
  const act = actionOf(a), r = resultOf(a), type = String(act.type || "");
  if (type === "exec" || type.startsWith("process_")) showCommand(box, a, act, r);
  else if (type.startsWith("file_")) showFile(box, a, act, r);
  if (box.childElementCount && !a.ok && a.error) box.appendChild(el("p", "failed: " + a.error.code, "bad"));
}

// One events request: true when the page should ask again later.
async function load() {
  let response;
  try {
    response = await get("/recording/events?after=" + after, "no-store");
  } catch (_) {
    setStatus("the gateway does not answer; trying again");
    return true;
  }
  if (!response.ok) {
    const why = await reason(response);
    if (response.status >= 500) { setStatus("the gateway failed (" + why + "); trying again"); return true; }
    // A refused or unknown credential (or a session token whose session has gone) stays refused.
    if (actions.length) setStatus("stopped: " + why);
    else document.getElementById("heading").textContent = "Cannot read this session: " + why;
    return false;
  }
  const body = await response.json();
  const fresh = [];
  for (const e of body.events) {
    after = Math.max(after, e.seq);
    if (e.event === "action") fresh.push(e);
  }
  if (fresh.length) {
    add(fresh);
    if (current === 0) show(1); else position();
  }
  setStatus(body.ended ? "ended" : "live");
  return !body.ended;
}

async function poll() {
  // The next request is planned only once this one is over: never two at a time.
  if (await load()) setTimeout(poll, POLL_MS);
}

function add(fresh) {
  const list = document.getElementById("actions");
  for (const a of fresh) {
    actions.push(a);
    const step = actions.length;
    const item = document.createElement("li");
    item.textContent = step + ". " + summary(a);
    item.dataset.step = step;
    if (!a.ok) item.className = "failed";
    item.addEventListener("click", () => show(step));
    list.appendChild(item);
  }
  document.getElementById("timeline").max = Math.max(1, actions.length);
  if (current) mark();
}

function mark() {
  document.querySelectorAll("#actions li").forEach(li => li.classList.toggle("current", +li.dataset.step === current));
}

function position() {
  document.getElementById("position").textContent = "step " + current + " of " + actions.length;
}

function setFrame(blob, name) {
  const frame = document.getElementById("frame");
  if (frameUrl) URL.revokeObjectURL(frameUrl);
  frameUrl = blob ? URL.createObjectURL(blob) : null;
  if (frameUrl) {
    frame.src = frameUrl;
    frame.dataset.frame = name;
  } else {
    frame.removeAttribute("src");
    delete frame.dataset.frame;
  }
}

async function showFrame(a, mine) {
  if (!a.frame) { setFrame(null); return; }
  const name = a.frame.split("/").pop();
  try {
    const response = await get("/recording/frames/" + encodeURIComponent(name));
    const blob = response.ok ? await response.blob() : null;
    if (mine === shown) setFrame(blob, name);  // a later step's frame may have come first
  } catch (_) {
    if (mine === shown) setFrame(null);
  }
}

async function showTraffic(a, mine) {
  const rows = document.getElementById("network");
  rows.replaceChildren();
  if (!a.action_id) return;
  let text;
  try {
    const traffic = await get("/traffic?action=" + encodeURIComponent(a.action_id));
    if (!traffic.ok) return;
    text = await traffic.text();
  } catch (_) {
    return;
  }
  if (mine !== shown) return;
  for (const line of text.split("\\n")) {
    if (!line.trim()) continue;
    const r = JSON.parse(line);  // an AuditRecord (corral.proxy.audit): a unit test holds the fields read here to it
    const row = document.createElement("tr");
    // A brokered secret's use or refusal: its name and where (the log never holds its value).
    const secret = r.secret ? " (" + r.secret + " in " + (r.location || "?") +
      (typeof r.count === "number" ? " x" + r.count : "") + (r.exfiltration ? ", exfiltration" : "") + ")" : "";
    row.className = (r.decision || "") + (r.event === "secret" ? " secret" : "");
    const values = [r.seq, r.event, r.decision || "", r.method || "", r.url || r.host, r.status ?? "",
      (r.rule || "") + secret];
    for (const value of values) {
      const cell = document.createElement("td");
      cell.textContent = value;
      row.appendChild(cell);
    }
    rows.appendChild(row);
  }
}

function show(step) {
  if (!actions.length) return;
  current = Math.min(Math.max(1, step), actions.length);
  const mine = ++shown;
  const a = actions[current - 1];
  document.getElementById("timeline").value = current;
  position();
  document.getElementById("details").textContent = JSON.stringify({
    step: current, action: summary(a), ok: a.ok, error: a.error || null, url: a.url, title: a.title,
    elapsed_ms: a.elapsed_ms, action_id: a.action_id, dialect: a.dialect, request: a.request
  }, null, 2);
  showResult(a);
  mark();
  showFrame(a, mine);
  showTraffic(a, mine);
}

document.getElementById("timeline").addEventListener("input", e => show(+e.target.value));
document.addEventListener("keydown", e => {
  if (e.target.id === "timeline") return;  // the slider moves itself (and says so through "input")
  if (e.key === "ArrowRight") show(current + 1);
  if (e.key === "ArrowLeft") show(current - 1);
});
if (token) poll();
else document.getElementById("heading").textContent =
  "Open this page as .../viewer#token=<API key or session token>";
</script></body></html>
"""


class ViewerPage(NamedTuple):
    body: str
    headers: dict[str, str]


def viewer_page(session_id: str) -> ViewerPage:
    """The page for ``session_id`` (a well-formed id) with its headers: a fresh CSP nonce each time."""
    nonce = secrets.token_urlsafe(18)
    # Plain substitution: the page is full of braces (CSS, JavaScript).
    body = (
        _PAGE.replace("__TITLE__", html.escape(session_id))
        .replace("__SESSION__", json.dumps(session_id))
        .replace("__POLL_MS__", str(POLL_MS))
        .replace("__NONCE__", nonce)
    )
    return ViewerPage(body, {**VIEWER_HEADERS, "content-security-policy": _CSP.format(nonce=nonce)})
