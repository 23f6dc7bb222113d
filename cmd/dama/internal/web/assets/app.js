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

function duration(from, to) {
  if (!from) return "-";
  let s = Math.max(0, Math.round(((to ? new Date(to) : new Date()) - new Date(from)) / 1000));
  if (s < 60) return s + "s";
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  s %= 60;
  return d ? d + "d" + h + "h" : h ? h + "h" + m + "m" : m + "m" + s + "s";
}

const time = (t) => (t ? new Date(t).toLocaleString() : "-");
const json = (v) => (v === null || v === undefined ? "" : JSON.stringify(v));

let config = { read_only: true, queues: [], kinds: [] };

// ---- Tasks ----

function fillSelect(name, values) {
  const select = $(`#filters [name=${name}]`);
  for (const v of values) select.append(el("option", v));
}

async function tasksPage() {
  const params = new URLSearchParams(new FormData($("#filters")));
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  const { tasks, limit } = await get("/api/tasks?" + params);
  const body = el("tbody");
  for (const t of tasks) {
    const tr = row(cell(link("/tasks/" + t.etl_context_id, t.etl_context_id)), t.kind, t.queue, status(t.etl_status),
      t.attempt + "/" + t.max_attempts, t.host, t.pid, t.initial_event_locked ? "held" : "free",
      duration(t.started_at, t.finished_at), cell(bar(t)));
    tr.dataset.id = t.etl_context_id;
    tr.dataset.status = t.etl_status;
    body.append(tr);
  }
  $("#tasks tbody").replaceWith(body);
  $("#limit").textContent = tasks.length >= limit ? `the newest ${limit}: filter to see others` : "";
}

function setupTasks() {
  fillSelect("kind", config.kinds);
  fillSelect("queue", config.queues);
  const form = $("#filters");
  const url = new URLSearchParams(location.search);
  for (const [k, v] of url) if (form.elements[k]) form.elements[k].value = v;
  form.addEventListener("submit", (e) => e.preventDefault());
  form.addEventListener("input", () => {
    const params = new URLSearchParams(new FormData(form));
    for (const [k, v] of [...params]) if (!v) params.delete(k);
    history.replaceState(null, "", params.size ? "?" + params : location.pathname);
    refreshNow().catch(showError);
  });
}

// ---- A task ----

const taskID = () => location.pathname.split("/").pop();
let logNext = null;
let logDone = false;

async function taskPage() {
  const id = taskID();
  const d = await get("/api/tasks/" + id);
  const t = d.task;
  document.title = `dama: task ${t.etl_context_id}`;
  $("#title").textContent = `Task ${t.etl_context_id}: ${t.kind}`;
  const s = el("p");
  s.append(el("span", t.etl_status, "status status-" + t.etl_status),
    ` attempt ${t.attempt}/${t.max_attempts} · queue ${t.queue} · host ${t.host || "-"} · pid ${t.pid || "-"} · lock ${t.initial_event_locked ? "held" : "free"} · run time ${duration(t.started_at, t.finished_at)} · `,
    bar(t));
  if (t.idempotency_key) s.append(" · key " + t.idempotency_key);
  if (t.waiting_for) s.append(" · waiting: " + t.waiting_for);
  if (t.parent_context_id) s.append(" · parent ", link("/tasks/" + t.parent_context_id, t.parent_context_id));
  s.dataset.status = t.etl_status;
  $("#summary").replaceChildren(s);
  const finished = ["DONE", "FAILED", "CANCELLED"].includes(t.etl_status);
  $("#actions [data-action$='/cancel']").hidden = finished;
  $("#actions [data-action$='/retry']").hidden = !["FAILED", "CANCELLED"].includes(t.etl_status);
  $("#args").textContent = JSON.stringify(d.args, null, 2);
  $("#checkpoint").textContent = d.checkpoint ? JSON.stringify(d.checkpoint, null, 2) : "none";

  const attempts = el("tbody");
  for (const a of d.attempts) {
    const tail = el("td");
    if (a.log_tail) { const det = el("details"); det.append(el("summary", "tail"), el("pre", a.log_tail)); tail.append(det); }
    attempts.append(row(a.attempt, a.host, a.pid, time(a.started_at), time(a.ended_at), a.outcome || "running",
      a.exit_code ?? "-", a.reason, tail));
  }
  $("#attempts tbody").replaceWith(attempts);

  const kids = el("tbody");
  for (const c of d.children) kids.append(row(cell(link("/tasks/" + c.etl_context_id, c.etl_context_id)), c.kind, status(c.etl_status), cell(bar(c))));
  $("#children tbody").replaceWith(kids);

  const events = el("tbody");
  for (const e of d.events) {
    // A payload read cut short comes as {"dama_truncated": {bytes, head}}:
    // its head, and a link to the whole event.
    const cut = e.payload && e.payload.dama_truncated && typeof e.payload.dama_truncated.head === "string" ? e.payload.dama_truncated : null;
    const text = cut ? cut.head : json(e.payload);
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
    events.append(row(time(e.created_at), e.attempt, e.type, what));
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
  const { queues, history } = await get("/api/queues");
  const paused = new Map(config.queues.map((q) => [q, null]));
  const blocked = new Map(config.kinds.map((k) => [k, null]));
  const body = el("tbody");
  for (const q of queues) {
    if (q.queue && (q.paused || !paused.has(q.queue))) paused.set(q.queue, q.paused ? q : null);
    if (q.kind && (q.blocked || !blocked.has(q.kind))) blocked.set(q.kind, q.blocked ? q : null);
    if (!q.queue || !q.kind) continue;
    body.append(row(q.queue, q.kind, num(q.queued), num(q.scheduled), num(q.running), num(q.retrying), num(q.done_24h),
      num(q.failed_24h), num(q.cancelled_24h), q.oldest_waiting ? duration(new Date(Date.now() - q.oldest_waiting / 1e6)) : "-"));
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
  for (const h of history) log.append(row(time(h.created_at), h.action, h.queue || h.kind, h.reason, h.actor));
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
