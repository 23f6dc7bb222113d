// dama's status page: each page reads the JSON API every second.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; };

// The action token lives in this tab only.
const tokenInput = $("#token");
if (tokenInput) {
  tokenInput.value = sessionStorage.getItem("dama-token") || "";
  tokenInput.addEventListener("change", () => sessionStorage.setItem("dama-token", tokenInput.value));
}

async function get(url) {
  const r = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function act(url) {
  const r = await fetch(url, { method: "POST", headers: { "X-Dama-Token": tokenInput ? tokenInput.value : "" } });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function showError(err) { $("#error").textContent = err ? String(err.message || err) : ""; }

function bar(t) {
  if (!t.bar) return el("span", t.progress ? JSON.stringify(t.progress) : "-");
  const outer = el("span", undefined, "bar");
  outer.title = t.bar.label;
  const inner = el("span");
  inner.style.width = (t.bar.fraction * 100).toFixed(1) + "%";
  outer.appendChild(inner);
  const wrap = el("span");
  wrap.append(outer, " " + t.bar.label);
  return wrap;
}

function duration(from, to) {
  if (!from) return "-";
  const s = Math.max(0, ((to ? new Date(to) : new Date()) - new Date(from)) / 1000);
  if (s < 60) return s.toFixed(0) + "s";
  if (s < 3600) return (s / 60).toFixed(0) + "m";
  return (s / 3600).toFixed(1) + "h";
}

async function tasksPage() {
  const params = new URLSearchParams(new FormData($("#filters")));
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  const { tasks } = await get("/api/tasks?" + params);
  const body = el("tbody");
  for (const t of tasks) {
    const tr = el("tr");
    tr.dataset.id = t.etl_context_id;
    const id = el("td"); const a = el("a", String(t.etl_context_id)); a.href = "/tasks/" + t.etl_context_id; id.appendChild(a);
    const progress = el("td"); progress.appendChild(bar(t));
    tr.append(id, el("td", t.kind), el("td", t.queue), el("td", t.etl_status, "status status-" + t.etl_status),
      el("td", t.attempt + "/" + t.max_attempts), el("td", t.host || "-"), el("td", t.pid || "-"),
      el("td", t.initial_event_locked ? "yes" : "no"), el("td", duration(t.started_at, t.finished_at)), progress);
    body.appendChild(tr);
  }
  $("#tasks tbody").replaceWith(body);
}

let logOffset = 0;
async function taskPage() {
  const id = location.pathname.split("/").pop();
  const d = await get("/api/tasks/" + id);
  const t = d.task;
  $("#title").textContent = "Task " + t.etl_context_id + " (" + t.kind + ")";
  const summary = el("p");
  summary.append(el("span", t.etl_status, "status status-" + t.etl_status), " attempt " + t.attempt + "/" + t.max_attempts +
    ", host " + (t.host || "-") + ", pid " + (t.pid || "-") + ", lock " + (t.initial_event_locked ? "held" : "free") + " ", bar(t));
  if (t.parent_context_id) { const p = el("a", " parent " + t.parent_context_id); p.href = "/tasks/" + t.parent_context_id; summary.append(p); }
  $("#summary").replaceChildren(summary);
  $("#args").textContent = JSON.stringify(d.args, null, 2);
  $("#checkpoint").textContent = d.checkpoint ? JSON.stringify(d.checkpoint, null, 2) : "none";
  const kids = el("ul");
  for (const c of d.children) { const li = el("li"); const a = el("a", c.etl_context_id + " " + c.kind + " " + c.etl_status); a.href = "/tasks/" + c.etl_context_id; li.appendChild(a); kids.appendChild(li); }
  $("#children").replaceWith(kids); kids.id = "children";
  const events = el("tbody");
  for (const e of d.events) {
    const tr = el("tr");
    tr.append(el("td", new Date(e.created_at).toLocaleString()), el("td", String(e.attempt)), el("td", e.type),
      el("td", e.payload ? JSON.stringify(e.payload) : ""));
    events.appendChild(tr);
  }
  $("#events tbody").replaceWith(events);
  if (d.log_here) {
    try {
      const l = await get("/api/tasks/" + id + "/log?offset=" + logOffset);
      $("#log").textContent += l.data; logOffset = l.next;
    } catch (err) { $("#log").textContent = String(err.message); }
  } else {
    $("#log").textContent = "the log is on host " + (t.host || "-") + ": run dama web there to follow it";
  }
}

async function queuesPage() {
  const { queues } = await get("/api/queues");
  const body = el("tbody");
  for (const q of queues) {
    const tr = el("tr");
    tr.append(el("td", q.queue || "-"), el("td", q.kind || "-"), el("td", String(q.queued)), el("td", String(q.scheduled)),
      el("td", String(q.running)), el("td", String(q.retrying)), el("td", String(q.done_24h)), el("td", String(q.failed_24h)),
      el("td", String(q.cancelled_24h)), el("td", q.oldest_waiting ? (q.oldest_waiting / 1e9).toFixed(0) + "s" : "-"),
      el("td", q.paused ? "paused: " + (q.pause_reason || "") : "-"), el("td", q.blocked ? "blocked: " + (q.block_reason || "") : "-"));
    body.appendChild(tr);
  }
  $("#queues tbody").replaceWith(body);
}

const pages = { tasks: tasksPage, task: taskPage, queues: queuesPage };
const refresh = pages[document.body.dataset.page];
async function loop() {
  try { await refresh(); showError(null); } catch (err) { showError(err); }
  setTimeout(loop, 1000);
}
loop();

for (const name of ["cancel", "retry"]) {
  const button = $("#" + name);
  if (button) button.addEventListener("click", async () => {
    try { await act("/api/tasks/" + location.pathname.split("/").pop() + "/" + name); showError(null); } catch (err) { showError(err); }
  });
}
const filters = $("#filters");
if (filters) filters.addEventListener("input", () => tasksPage().catch(showError));
