"""The session viewer: one self-contained page, served by the gateway, for a live or recorded session.

A timeline to scrub through the frames, the list of actions, and for the chosen action what it
was, how it went and the network requests it caused (from the egress audit log). It reads the
recording's events, frames and the session's traffic with the credentials it was opened with
(``?token=`` in its own URL, passed on), and polls while the session lives.
"""

from __future__ import annotations

import html
import json

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Corral session __TITLE__</title>
<style>
body{margin:0;font:13px sans-serif;display:grid;grid-template-columns:300px 1fr;height:100vh}
#actions{overflow:auto;border-right:1px solid #ccc;margin:0;padding:0;list-style:none}
#actions li{padding:4px 8px;cursor:pointer;border-bottom:1px solid #eee}
#actions li.failed{color:#b00}#actions li.current{background:#def}
main{padding:8px;overflow:auto}#frame{max-width:100%;border:1px solid #ccc}
#timeline{width:100%}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
.deny{color:#b00}.report{color:#a60}
</style></head><body>
<ul id="actions"></ul>
<main>
<h1 id="heading">Session __TITLE__</h1>
<input id="timeline" type="range" min="1" max="1" value="1" aria-label="timeline">
<p id="position"></p>
<img id="frame" alt="frame after the action">
<h2>Action</h2><pre id="details"></pre>
<h2>Network requests</h2>
<table><thead><tr><th>seq</th><th>event</th><th>decision</th><th>method</th><th>url / host</th><th>status</th>
<th>rule</th></tr></thead><tbody id="network"></tbody></table>
</main>
<script>
const session = __SESSION__;
const token = new URLSearchParams(location.search).get("token");
const auth = token ? "?token=" + encodeURIComponent(token) : "";
const base = "/v1/sessions/" + session;
let actions = [], current = 0, ended = false;

function summary(a) {
  const n = (a.native || [])[0] || {};
  const parts = Object.entries(n).filter(([k, v]) => k !== "type" && typeof v !== "object").slice(0, 3);
  return (n.type || a.dialect || "request") + " " + parts.map(([k, v]) => k + "=" + v).join(" ");
}

async function load() {
  const response = await fetch(base + "/recording/events" + auth);
  if (!response.ok) {
    document.getElementById("heading").textContent = "Cannot read this session: " + response.status;
    return;
  }
  const events = await response.json();
  const fresh = events.filter(e => e.event === "action");
  const grew = fresh.length !== actions.length;
  actions = fresh;
  if (grew) { render(); if (current === 0 && actions.length) show(1); }
}

function render() {
  const list = document.getElementById("actions");
  list.innerHTML = "";
  actions.forEach((a, i) => {
    const item = document.createElement("li");
    item.textContent = (i + 1) + ". " + summary(a);
    item.dataset.step = i + 1;
    if (!a.ok) item.className = "failed";
    item.onclick = () => show(i + 1);
    list.appendChild(item);
  });
  const timeline = document.getElementById("timeline");
  timeline.max = Math.max(1, actions.length);
  if (current) mark();
}

function mark() {
  document.querySelectorAll("#actions li").forEach(li => li.classList.toggle("current", +li.dataset.step === current));
}

async function show(step) {
  if (!actions.length) return;
  current = Math.min(Math.max(1, step), actions.length);
  const a = actions[current - 1];
  document.getElementById("timeline").value = current;
  document.getElementById("position").textContent = "step " + current + " of " + actions.length;
  const frame = document.getElementById("frame");
  if (a.frame) frame.src = base + "/recording/" + a.frame + auth; else frame.removeAttribute("src");
  document.getElementById("details").textContent = JSON.stringify({
    step: current, action: summary(a), ok: a.ok, error: a.error || null, url: a.url, title: a.title,
    elapsed_ms: a.elapsed_ms, action_id: a.action_id, dialect: a.dialect, request: a.request
  }, null, 2);
  mark();
  const rows = document.getElementById("network");
  rows.innerHTML = "";
  if (!a.action_id) return;
  const query = (auth ? auth + "&" : "?") + "action=" + encodeURIComponent(a.action_id);
  const traffic = await fetch(base + "/traffic" + query);
  if (!traffic.ok) return;
  for (const line of (await traffic.text()).split("\\n")) {
    if (!line.trim()) continue;
    const r = JSON.parse(line);
    const row = document.createElement("tr");
    row.className = r.decision || "";
    const values = [r.seq, r.event, r.decision, r.method || "", r.url || r.host, r.status ?? "", r.rule || ""];
    for (const value of values) {
      const cell = document.createElement("td");
      cell.textContent = value;
      row.appendChild(cell);
    }
    rows.appendChild(row);
  }
}

document.getElementById("timeline").addEventListener("input", e => show(+e.target.value));
document.addEventListener("keydown", e => {
  if (e.target.id === "timeline") return;  // the slider moves itself (and says so through "input")
  if (e.key === "ArrowRight") show(current + 1);
  if (e.key === "ArrowLeft") show(current - 1);
});
load();
setInterval(() => { if (!ended) load(); }, 2000);
</script></body></html>
"""


def viewer_page(session_id: str) -> str:
    # Plain substitution: the page is full of braces (CSS, JavaScript).
    return _PAGE.replace("__TITLE__", html.escape(session_id)).replace("__SESSION__", json.dumps(session_id))
