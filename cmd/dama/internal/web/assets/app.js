// dama's status page. Each page reads the JSON API every second and
// redraws; actions send the token (kept in this tab only) in a header.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, text, cls) => {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
};
const link = (href, text) => { const a = el("a", text); a.href = href; return a; };
const cell = (child, cls) => { const td = el("td", undefined, cls); td.append(child); return td; };
const row = (...cells) => { const tr = el("tr"); tr.append(...cells.map((c) => (c instanceof Node ? c : el("td", c ?? "-")))); return tr; };
const num = (n) => el("td", n ?? 0, "num");

const tokenInput = $("#token");
const actorInput = $("#actor");
tokenInput.value = sessionStorage.getItem("dama-token") || "";
tokenInput.addEventListener("input", () => sessionStorage.setItem("dama-token", tokenInput.value));
actorInput.value = localStorage.getItem("dama-actor") || "";
actorInput.addEventListener("input", () => localStorage.setItem("dama-actor", actorInput.value));

async function get(url) {
  // The token field also holds a read token, for a page that needs one.
  const r = await fetch(url, { headers: { Accept: "application/json", "X-Dama-Read-Token": tokenInput.value } });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function act(url, body) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Dama-Token": tokenInput.value, "X-Dama-Actor": actorInput.value },
    body: JSON.stringify(body || {}),
  });
  const reply = await r.json();
  if (!r.ok) throw new Error(reply.error || r.statusText);
  return reply;
}

function showError(err) { $("#error").textContent = err ? String(err.message || err) : ""; }

// button makes an action button whose outcome shows in #done until the
// next action.
function button(label, url, body, done) {
  const b = el("button", label);
  b.type = "button";
  b.dataset.action = url;
  b.addEventListener("click", async () => {
    b.disabled = true;
    const out = $("#done");
    try {
      const reply = await act(url, typeof body === "function" ? body() : body);
      out.textContent = typeof done === "function" ? done(reply) : done;
      out.className = "";
      await refreshNow();
    } catch (err) {
      out.textContent = "refused: " + String(err.message || err);
      out.className = "failed";
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

// bar draws a task's progress: a bar when its latest PROGRESS says how far
// along it is, else the payload itself.
function bar(t) {
  if (!t.bar) return el("span", t.progress ? JSON.stringify(t.progress) : "-");
  const wrap = el("span", undefined, "progress");
  const p = el("progress");
  p.max = 1;
  p.value = t.bar.fraction;
  p.title = t.bar.label;
  wrap.append(p, " " + t.bar.label);
  return wrap;
}

function status(s) { return el("td", s, "status status-" + s); }

// span writes a number of seconds as people do, to its two largest units:
// 45s, 12m5s, 3h12m, 2d3h (as dama status does).
function span(secs) {
  let s = Math.max(0, Math.round(secs));
  if (s < 60) return s + "s";
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  s %= 60;
  return d ? d + "d" + h + "h" : h ? h + "h" + m + "m" : m + "m" + s + "s";
}

function duration(from, to) {
  if (!from) return "-";
  return span(((to ? new Date(to) : new Date()) - new Date(from)) / 1000);
}

// stamp shows a time relative to now ("3m12s ago", "in 5m"), the absolute
// one on hover.
function stamp(t, words) {
  if (!t) return el("span", "-");
  const d = new Date(t);
  const secs = (d - new Date()) / 1000;
  const e = el("time", words ?? (secs > 0 ? "in " + span(secs) : span(-secs) + " ago"));
  e.dateTime = d.toISOString();
  e.title = d.toLocaleString(undefined, { timeZoneName: "short" });
  return e;
}

// because shows why a task is where it is (the server's reason): what it
// waits for and for how long, a retry's error and when it is retried, when
// it is due, after what error (as dama status does).
function because(r) {
  const e = el("span");
  if (!r || !(r.text || r.since || r.until || r.after)) { e.textContent = "-"; return e; }
  if (r.text) e.append(r.text);
  if (r.since) e.append(" for ", stamp(r.since, span((new Date() - new Date(r.since)) / 1000)));
  if (r.retry) e.append(", ", r.until ? el("span", "retry ") : "retrying", r.until ? stamp(r.until) : "");
  else if (r.until) e.append(r.text ? " " : "", "due ", stamp(r.until));
  if (r.after) e.append((r.text || r.until ? ", " : "") + "after: " + r.after);
  return e;
}

// took is how long a task has to go (ETA) while it runs, else how long it
// ran.
function took(t) {
  if (t.eta !== null && t.eta !== undefined) { const e = el("span", "ETA " + span(t.eta)); e.title = "at its pace so far"; return e; }
  return el("span", t.etl_status === "RUNNING" || t.finished_at ? duration(t.started_at, t.finished_at) : "-");
}

const json = (v) => (v === null || v === undefined ? "" : JSON.stringify(v));

let config = { read_only: true, queues: [], kinds: [] };

// ---- Tasks ----

const statuses = ["QUEUED", "RUNNING", "RETRYING", "DONE", "FAILED", "CANCELLED"];
// picked are the tasks selected for a bulk action, by id, with the status
// each had when selected: kept across redraws while they are shown, in
// that status.
const picked = new Map();
let chartPer = "hour";
let chartAt = 0;

function fillSelect(name, values) {
  const select = $(`#filters [name=${name}]`);
  for (const v of values) select.append(el("option", v));
}

// filters are the list's filters as in the address, without the page.
function filters() {
  const params = new URLSearchParams(new FormData($("#filters")));
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  return params;
}

function here(params) { return params.size ? "?" + params : location.pathname; }

async function tasksPage() {
  const params = filters();
  const before = new URLSearchParams(location.search).get("before");
  if (before) params.set("before", before);
  const { tasks, limit, counts, count_cap: cap, next } = await get("/api/tasks?" + params);
  drawTabs(counts, cap);
  const body = el("tbody");
  const canAct = !config.read_only;
  // A selected task that left the list, or changed status since it was
  // selected, is no longer selected: an action applies to what is shown.
  const shown = new Map(tasks.map((t) => [t.etl_context_id, t.etl_status]));
  for (const [id, st] of [...picked]) if (shown.get(id) !== st) picked.delete(id);
  for (const t of tasks) {
    const cells = [];
    if (canAct) {
      const box = el("input");
      box.type = "checkbox";
      box.checked = picked.has(t.etl_context_id);
      box.setAttribute("aria-label", "select task " + t.etl_context_id);
      box.addEventListener("change", () => { box.checked ? picked.set(t.etl_context_id, t.etl_status) : picked.delete(t.etl_context_id); drawPicked(); });
      cells.push(cell(box, "pick"));
    }
    cells.push(cell(link("/tasks/" + t.etl_context_id, t.etl_context_id), "num"), t.kind, t.queue, status(t.etl_status),
      el("td", t.attempt + "/" + t.max_attempts, "num"), cell(bar(t), "progress"), cell(took(t), "num"),
      cell(because(t.reason), "reason"), cell(stamp(t.created_at), "num"), t.host);
    const tr = row(...cells);
    tr.dataset.id = t.etl_context_id;
    tr.dataset.status = t.etl_status;
    body.append(tr);
  }
  $("#tasks tbody").replaceWith(body);
  $("#tasks th.pick").hidden = !canAct;
  $("#pick-all").checked = tasks.length > 0 && tasks.every((t) => picked.has(t.etl_context_id));
  const older = $("#older"), newest = $("#newest");
  older.hidden = !next;
  if (next) { const p = filters(); p.set("before", next); older.href = here(p); }
  newest.hidden = !before;
  newest.href = here(filters());
  $("#limit").textContent = tasks.length ? `tasks ${tasks[0].etl_context_id} to ${tasks[tasks.length - 1].etl_context_id}, ${limit} a page` : "no task";
  drawPicked();
  if (Date.now() - chartAt > 10000) { chartAt = Date.now(); await chart(); }
}

// drawTabs draws a tab per status with its count, each a link that keeps
// the other filters.
function drawTabs(counts, cap) {
  const current = filters().get("status") || "";
  const counted = counts !== undefined && counts !== null;
  counts = counts || {};
  const tabs = [];
  const total = statuses.reduce((n, s) => n + (counts[s] || 0), 0);
  for (const s of ["", ...statuses]) {
    const p = filters();
    s ? p.set("status", s) : p.delete("status");
    const a = link(here(p), s ? s[0] + s.slice(1).toLowerCase() : "All");
    const n = s ? counts[s] || 0 : total;
    const capped = s ? n >= cap : statuses.some((x) => (counts[x] || 0) >= cap);
    if (counted) a.append(" ", el("span", n.toLocaleString() + (capped ? "+" : ""), "count"));
    a.dataset.status = s;
    if (s === current) a.setAttribute("aria-current", "page");
    tabs.push(a);
  }
  $("#tabs").replaceChildren(...tabs);
}

// confirming is the bulk action asked for, until confirmed: its name and
// the statuses it applies to, with the selection it was asked for.
let confirming = null;
// busy is set while a bulk action runs: another waits for its end.
let busy = false;

function drawPicked() {
  const key = [...picked.keys()].join(",");
  if (confirming && confirming.key !== key) {
    confirming = null;
    $("#done").textContent = "the selection changed: ask again";
  }
  for (const b of document.querySelectorAll("#bulk button")) b.disabled = busy;
  $("#bulk").hidden = picked.size === 0 && !busy;
  $("#picked").textContent = `${picked.size} selected`;
  $("#bulk-confirm").hidden = !confirming;
  if (confirming) $("#bulk-yes").textContent = `Yes, ${confirming.action} ${confirming.ids.length}`;
}

// ask asks to confirm a bulk action, naming the tasks it applies to.
function ask(action, applies) {
  if (busy) return;
  const ids = [...picked].filter(([, s]) => applies(s)).map(([id]) => id);
  const out = $("#done");
  if (!ids.length) {
    out.textContent = `none of the selected tasks can be ${action === "retry" ? "retried" : "cancelled"}`;
    out.className = "failed";
    return;
  }
  out.textContent = `${action} task${ids.length > 1 ? "s" : ""} ${ids.join(", ")}?`;
  out.className = "";
  confirming = { action, ids, key: [...picked.keys()].join(",") };
  drawPicked();
}

// bulk does a confirmed action to each task it applies to, one after the
// other, each guarded and recorded as the task's own page's would be.
async function bulk({ action, ids }) {
  if (busy) return;
  confirming = null;
  busy = true;
  drawPicked();
  const out = $("#done");
  let ok = 0;
  const refused = [];
  try {
    for (const id of ids) {
      out.textContent = `${action}: ${ok + refused.length}/${ids.length}`;
      try { await act(`/api/tasks/${id}/${action}`); ok++; picked.delete(id); } catch (err) { refused.push(`task ${id}: ${err.message || err}`); }
    }
  } finally {
    busy = false;
  }
  out.textContent = `${action}: ${ok} of ${ids.length} done` + (refused.length ? `; refused: ${refused.join("; ")}` : "");
  out.className = refused.length ? "failed" : "";
  drawPicked();
  await refreshNow();
}

// chart draws the tasks finished per hour (or minute) over the last day,
// stacked by status, from the server's counts.
async function chart() {
  const p = filters();
  p.delete("status"); p.delete("q");
  p.set("per", chartPer);
  const { since, spans } = await get("/api/finished?" + p);
  for (const b of document.querySelectorAll(".toggle button")) b.setAttribute("aria-pressed", String(b.dataset.per === chartPer));
  const svg = $("#chart");
  const ns = "http://www.w3.org/2000/svg";
  const mk = (tag, attrs, text) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  const W = Math.max(svg.clientWidth, 300), H = svg.clientHeight || 110, left = 40, bottom = 16;
  const unit = chartPer === "hour" ? 3600e3 : 60e3;
  const start = Math.floor(new Date(since).getTime() / unit) * unit;
  const slots = Math.ceil((Date.now() - start) / unit);
  const max = Math.max(1, ...spans.map((s) => s.done + s.failed + s.cancelled));
  const w = (W - left) / slots, scale = (H - bottom - 4) / max;
  const parts = [mk("line", { x1: left, y1: H - bottom, x2: W, y2: H - bottom, class: "axis" }),
    mk("text", { x: left - 6, y: 10, "text-anchor": "end" }, max), mk("text", { x: left - 6, y: H - bottom, "text-anchor": "end" }, 0),
    mk("text", { x: left, y: H - 2 }, new Date(start).toLocaleString()), mk("text", { x: W, y: H - 2, "text-anchor": "end" }, "now")];
  let done = 0, failed = 0;
  for (const s of spans) {
    const at = new Date(s.at).getTime();
    const x = left + Math.floor((at - start) / unit) * w;
    let y = H - bottom;
    const g = mk("g", {});
    g.append(mk("title", {}, `${new Date(at).toLocaleString()}: ${s.done} done, ${s.failed} failed, ${s.cancelled} cancelled`));
    for (const k of ["done", "failed", "cancelled"]) {
      if (!s[k]) continue;
      const h = s[k] * scale;
      y -= h;
      g.append(mk("rect", { x, y, width: Math.max(w - (w > 3 ? 1 : 0), 1), height: h, class: k }));
    }
    done += s.done; failed += s.failed;
    parts.push(g);
  }
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren(...parts);
  $("#chart-note").textContent = `${done.toLocaleString()} done, ${failed.toLocaleString()} failed`;
}

function setupTasks() {
  fillSelect("kind", config.kinds);
  fillSelect("queue", config.queues);
  const form = $("#filters");
  const url = new URLSearchParams(location.search);
  for (const [k, v] of url) if (form.elements[k]) form.elements[k].value = v;
  form.addEventListener("submit", (e) => e.preventDefault());
  form.addEventListener("input", () => {
    // A filter changed: back to the newest page, nothing selected.
    picked.clear();
    history.replaceState(null, "", here(filters()));
    chartAt = 0;
    refreshNow().catch(showError);
  });
  for (const b of document.querySelectorAll(".toggle button")) {
    b.addEventListener("click", () => { chartPer = b.dataset.per; chartAt = 0; refreshNow().catch(showError); });
  }
  $("#pick-all").addEventListener("change", (e) => {
    for (const tr of document.querySelectorAll("#tasks tbody tr")) {
      const id = Number(tr.dataset.id);
      e.target.checked ? picked.set(id, tr.dataset.status) : picked.delete(id);
      tr.querySelector(".pick input").checked = e.target.checked;
    }
    drawPicked();
  });
  const finished = ["DONE", "FAILED", "CANCELLED"];
  $("#bulk-retry").addEventListener("click", () => ask("retry", (s) => s === "FAILED" || s === "CANCELLED"));
  $("#bulk-cancel").addEventListener("click", () => ask("cancel", (s) => !finished.includes(s)));
  $("#bulk-yes").addEventListener("click", () => { if (confirming && !busy) bulk(confirming).catch(showError); });
  $("#bulk-no").addEventListener("click", () => { confirming = null; $("#done").textContent = ""; drawPicked(); });
  $("#bulk-clear").addEventListener("click", () => { picked.clear(); confirming = null; $("#done").textContent = ""; refreshNow().catch(showError); });
}

// ---- A task ----

const taskID = () => location.pathname.split("/").pop();
let logNext = null;
let logDone = false;

// bytes writes n as the configuration writes a size: 512MiB, 1.5GiB.
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (Math.round(n * 10) / 10) + units[i];
}

async function taskPage() {
  const id = taskID();
  const d = await get("/api/tasks/" + id);
  const t = d.task;
  document.title = `dama: task ${t.etl_context_id}`;
  $("#title").textContent = `Task ${t.etl_context_id}: ${t.kind}`;
  const s = el("p");
  s.append(el("span", t.etl_status, "status status-" + t.etl_status),
    ` attempt ${t.attempt}/${t.max_attempts} · queue ${t.queue} · host ${t.host || "-"} · pid ${t.pid || "-"} · lock ${t.initial_event_locked ? "held" : "free"} · `,
    t.eta === null ? "run time " + duration(t.started_at, t.finished_at) : took(t), " · ", bar(t), " · submitted ", stamp(t.created_at));
  const r = t.reason || {};
  if (r.text || r.since || r.until || r.after) s.append(" · ", because(r));
  if (t.idempotency_key) s.append(" · key " + t.idempotency_key);
  if (t.parent_context_id) s.append(" · parent ", link("/tasks/" + t.parent_context_id, t.parent_context_id));
  s.dataset.status = t.etl_status;
  $("#summary").replaceChildren(s);
  const finished = ["DONE", "FAILED", "CANCELLED"].includes(t.etl_status);
  $("#actions [data-action$='/cancel']").hidden = finished;
  $("#actions [data-action$='/retry']").hidden = !["FAILED", "CANCELLED"].includes(t.etl_status);
  $("#args").textContent = JSON.stringify(d.args, null, 2);
  $("#checkpoint").textContent = d.checkpoint ? JSON.stringify(d.checkpoint, null, 2) : "none";

  const attempts = el("tbody");
  // What attempts cost, where one was measured (in a control group).
  const measured = d.attempts.some(a => a.cpu_seconds != null);
  for (const th of document.querySelectorAll("#attempts th.cost")) th.hidden = !measured;
  for (const a of d.attempts) {
    const tail = el("td");
    if (a.log_tail) { const det = el("details"); det.append(el("summary", "tail"), el("pre", a.log_tail)); tail.append(det); }
    const cost = !measured ? [] : [a.cpu_seconds == null ? "-" : a.cpu_seconds.toFixed(2) + "s",
      a.peak_memory_bytes == null ? "-" : bytes(a.peak_memory_bytes) + (a.memory_limit_bytes ? " of " + bytes(a.memory_limit_bytes) : ""),
      a.io_read_bytes == null ? "-" : bytes(a.io_read_bytes) + " / " + bytes(a.io_write_bytes)];
    attempts.append(row(a.attempt, a.host, a.pid, cell(stamp(a.started_at)), cell(stamp(a.ended_at)), a.outcome || "running",
      a.exit_code ?? "-", ...cost, a.reason, tail));
  }
  $("#attempts tbody").replaceWith(attempts);

  const kids = el("tbody");
  for (const c of d.children) kids.append(row(cell(link("/tasks/" + c.etl_context_id, c.etl_context_id)), c.kind, status(c.etl_status), cell(bar(c)), cell(because(c.reason), "reason")));
  $("#children tbody").replaceWith(kids);

  const events = el("tbody");
  for (const e of d.events) {
    // A payload read cut short comes as {"dama_truncated": {bytes, head}}:
    // its head, and a link to the whole event.
    const cut = e.payload && e.payload.dama_truncated && typeof e.payload.dama_truncated.head === "string" ? e.payload.dama_truncated : null;
    const text = e.summary || (cut ? cut.head : json(e.payload));
    const code = el("code", text.length > 300 ? text.slice(0, 300) + "…" : text);
    code.title = text.length > 300 ? text.slice(0, 4000) : "";
    const what = cell(code);
    if (cut) {
      // Fetched with the token, then shown in a tab of its own.
      const more = link(`/api/tasks/${id}/events/${e.event_id}`, `(${cut.bytes} bytes: whole)`);
      more.addEventListener("click", async (ev) => {
        ev.preventDefault();
        try {
          const whole = await get(more.getAttribute("href"));
          window.open(URL.createObjectURL(new Blob([JSON.stringify(whole.payload, null, 2)], { type: "application/json" })));
        } catch (err) { showError(err); }
      });
      what.append(" ", more);
    }
    events.append(row(cell(stamp(e.created_at)), e.attempt, e.type, what));
  }
  $("#events tbody").replaceWith(events);
  if (d.attempts_cut || d.children_cut) showError("part of this task's attempts or children are left out: the page would be too large");
  $("#events-note").textContent = d.events_cut ? `the newest ${d.events.length} events (the older ones would make the page too large)`
    : d.events.length >= d.events_limit ? `the newest ${d.events_limit} events` : "";

  if (!logDone) {
    const l = await get(`/api/tasks/${id}/log` + (logNext === null ? "" : "?offset=" + logNext));
    const log = $("#log");
    if (logNext === null || l.offset !== logNext) log.textContent = "";
    if (l.data) {
      // The tab keeps the log's last 256 KiB (about: characters, not bytes).
      const text = log.textContent + l.data;
      log.textContent = text.length > 262144 ? text.slice(text.length - 262144) : text;
      log.scrollTop = log.scrollHeight;
    }
    logNext = l.next;
    logDone = l.finished && !l.data;
    const where = l.source === "database" ? `the tail the database keeps (the log file is on host ${t.host || "-"})` : "the log file";
    $("#log-note").textContent = where + (logDone ? "" : ", followed live");
  }
}

function setupTask() {
  const id = taskID();
  $("#actions").hidden = config.read_only;
  $("#cancel").replaceWith(button("Cancel", `/api/tasks/${id}/cancel`, {},
    (r) => (r.status === "CANCELLED" ? "cancelled" : "asked to stop: it is cancelled once its process has stopped")));
  $("#retry").replaceWith(button("Retry", `/api/tasks/${id}/retry`, {}, "queued again"));
}

// ---- Queues ----

async function queuesPage() {
  const { queues, history, supervisors } = await get("/api/queues");
  const sups = el("tbody");
  for (const s of supervisors) {
    const serving = s.state === "SERVING";
    const list = (l) => (l && l.length ? l.join(", ") : "-");
    sups.append(row(el("td", s.state, serving ? "status status-RUNNING" : "status status-FAILED"), s.host, el("td", s.pid ?? "-", "num"),
      s.release ?? "earlier", list(s.lock_modes), list(s.queues), list(s.kinds), num(s.running ?? "-"),
      cell(stamp(s.started_at)), cell(stamp(s.last_seen_at))));
  }
  $("#supervisors tbody").replaceWith(sups);
  $("#unserved").hidden = supervisors.some((s) => s.state === "SERVING");
  const paused = new Map(config.queues.map((q) => [q, null]));
  const blocked = new Map(config.kinds.map((k) => [k, null]));
  const body = el("tbody");
  for (const q of queues) {
    if (q.queue && (q.paused || !paused.has(q.queue))) paused.set(q.queue, q.paused ? q : null);
    if (q.kind && (q.blocked || !blocked.has(q.kind))) blocked.set(q.kind, q.blocked ? q : null);
    if (!q.queue || !q.kind) continue;
    body.append(row(q.queue, q.kind, num(q.queued), num(q.scheduled), num(q.running), num(q.retrying), num(q.done_24h),
      num(q.failed_24h), num(q.cancelled_24h), el("td", q.oldest_waiting ? span(q.oldest_waiting / 1e9) : "-", "num")));
  }
  $("#queues tbody").replaceWith(body);

  const reason = () => ({ reason: $("#reason").value });
  // controls draws the queues (or the kinds) with their pause (or block)
  // and the button that changes it.
  const controls = (id, items, on, path, [onLabel, onDone], [offLabel, offDone]) => {
    const tb = el("tbody");
    for (const [name, q] of [...items].sort((a, b) => a[0].localeCompare(b[0]))) {
      const url = `${path}/${encodeURIComponent(name)}/`;
      const state = q ? el("td", `${on}: ${q.pause_reason ?? q.block_reason ?? ""}`, on) : el("td", "-");
      const action = el("td");
      if (!config.read_only) {
        action.append(q ? button(offLabel, url + offLabel.toLowerCase(), {}, `${name} ${offDone}`)
          : button(onLabel, url + onLabel.toLowerCase(), reason, `${name} ${onDone}`));
      }
      const tr = row(name, state, action);
      tr.dataset.name = name;
      tb.append(tr);
    }
    $(`#${id} tbody`).replaceWith(tb);
  };
  controls("queue-controls", paused, "paused", "/api/queues", ["Pause", "paused"], ["Resume", "resumed"]);
  controls("kind-controls", blocked, "blocked", "/api/kinds", ["Block", "blocked"], ["Unblock", "unblocked"]);

  const log = el("tbody");
  for (const h of history) log.append(row(cell(stamp(h.created_at)), h.action, h.queue || h.kind, h.reason, h.actor));
  $("#history tbody").replaceWith(log);
}

function setupQueues() { $("#reason-box").hidden = config.read_only; }

// ---- Every page ----

const pages = {
  tasks: [setupTasks, tasksPage],
  task: [setupTask, taskPage],
  queues: [setupQueues, queuesPage],
};
const [setup, refresh] = pages[document.body.dataset.page];

// refreshNow runs one refresh at a time: the loop's and an action's would
// otherwise both read the log from the same offset.
let running = null;
function refreshNow() {
  if (!running) running = refresh().finally(() => { running = null; });
  return running;
}

async function loop() {
  try {
    await refreshNow();
    showError(null);
    $("#live").className = "";
  } catch (err) {
    showError(err);
    $("#live").className = "stale";
  }
  setTimeout(loop, 1000);
}

(async () => {
  try {
    config = await get("/api/config");
  } catch (err) {
    showError(err);
  }
  $("#who").hidden = config.read_only;
  setup();
  loop();
})();
