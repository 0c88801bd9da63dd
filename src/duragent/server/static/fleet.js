// The console's views of many tasks: counts per agent and status (GET /v1/counts),
// queues and their limits (GET /v1/queues; an admin edits them: PUT/DELETE
// /v1/queues/NAME), and my schedules (GET /v1/schedules; their owner pauses,
// resumes, edits and deletes them). What the page offers is what the server
// permits: it shows the queue controls only to an admin (GET /v1/me says who is
// one), and the server refuses them to anyone else (403). Every text a client
// sent (names, inputs) is set as text, never as markup.

import { h } from "./timeline.js";

const enc = encodeURIComponent;

export function seconds(s) {
  if (s >= 86400 && s % 86400 === 0) return `${s / 86400} d`;
  if (s >= 3600 && s % 3600 === 0) return `${s / 3600} h`;
  if (s >= 60 && s % 60 === 0) return `${s / 60} min`;
  return `${s} s`;
}

// --- counts ---------------------------------------------------------------------

// One row per agent (GET /v1/counts?agent=A), a row for tasks of agents this server
// no longer has, and the totals; every number picks its tasks in the list.
export async function showCounts(api, agents, table, pick) {
  const sum = (c) => {
    const out = {};
    for (const row of Object.values(c.counts)) for (const [s, n] of Object.entries(row)) out[s] = (out[s] || 0) + n;
    return out;
  };
  const [total, ...each] = await Promise.all([
    api("GET", "/v1/counts"), ...agents.map((a) => api("GET", `/v1/counts?agent=${enc(a)}`)),
  ]);
  const all = sum(total);
  const rows = agents.map((a, i) => [a, sum(each[i])]).filter(([, c]) => Object.keys(c).length);
  const other = {};
  for (const [s, n] of Object.entries(all)) {
    const left = n - rows.reduce((acc, [, c]) => acc + (c[s] || 0), 0);
    if (left > 0) other[s] = left;
  }
  const statuses = Object.keys(all).sort();
  const cell = (agent, status, n) => h("td", {},
    n ? h("button", { class: "link count-pick", "data-agent": agent ?? "", "data-status": status ?? "",
                      onclick: () => pick({ agent, status }) }, String(n)) : "·");
  const line = (label, agent, c, cls) => h("tr", { class: cls, "data-agent": agent ?? "" },
    h("th", { scope: "row" }, label),
    ...statuses.map((s) => cell(agent, s, c[s] || 0)),
    cell(agent, null, Object.values(c).reduce((a, b) => a + b, 0)));
  table.replaceChildren(
    h("thead", {}, h("tr", {}, h("th", {}, "agent"), ...statuses.map((s) => h("th", { "data-status": s }, s)), h("th", {}, "all"))),
    h("tbody", {},
      ...rows.map(([a, c]) => line(a, a, c, "agent-row")),
      Object.keys(other).length ? line("other agents", null, other, "other-row") : null,
      line("all", null, all, "total-row")));
  return total.total;
}

// --- queues ---------------------------------------------------------------------

function queueLimits(q) {
  const limits = [];
  if (q.concurrency != null) limits.push(["concurrency", `${q.concurrency} at once`]);
  if (q.per_worker != null) limits.push(["per_worker", `${q.per_worker} per worker`]);
  if (q.per_owner != null) limits.push(["per_owner", `${q.per_owner} per owner`]);
  if (q.rate) limits.push(["rate", `${q.rate.tasks} starts per ${seconds(q.rate.seconds)}`]);
  if (q.ttl != null) limits.push(["ttl", `kept ${seconds(q.ttl)} after the end`]);
  if (!limits.length) return h("span", { class: "limit none" }, "no limits");
  return limits.map(([name, text]) => h("span", { class: "limit", "data-limit": name }, text));
}

const LIMIT_FIELDS = [
  ["concurrency", "At once, all workers"], ["per_worker", "At once per worker"],
  ["per_owner", "At once per user"], ["rate_tasks", "Starts…"], ["rate_seconds", "…per seconds"],
  ["ttl", "Keep finished (s)"],
];

// An admin's form for one queue's limits (PUT replaces them all; empty is none).
function limitsForm(q, { api, toast, problemText, done }) {
  const inputs = Object.fromEntries(LIMIT_FIELDS.map(([name]) => [name,
    h("input", { type: "number", min: "0", step: "any", name, "aria-label": name })]));
  const set = (name, v) => { inputs[name].value = v == null ? "" : String(v); };
  for (const name of ["concurrency", "per_worker", "per_owner", "ttl"]) set(name, q[name]);
  set("rate_tasks", q.rate?.tasks); set("rate_seconds", q.rate?.seconds);
  const num = (name) => (inputs[name].value === "" ? null : Number(inputs[name].value));
  const save = async (ev) => {
    ev.preventDefault();
    const body = { concurrency: num("concurrency"), per_worker: num("per_worker"), per_owner: num("per_owner"), ttl: num("ttl") };
    if (num("rate_tasks") != null || num("rate_seconds") != null) body.rate = { tasks: num("rate_tasks"), seconds: num("rate_seconds") };
    try { await api("PUT", `/v1/queues/${enc(q.name)}`, body); done(); } catch (err) { toast(problemText(err)); }
  };
  const remove = async () => {
    if (!confirm(`Remove every limit of queue ${q.name}? Its tasks stay.`)) return;
    try { await api("DELETE", `/v1/queues/${enc(q.name)}`); done(); } catch (err) { toast(problemText(err)); }
  };
  return h("form", { class: "limits-form", "data-queue": q.name, onsubmit: save },
    h("div", { class: "limits-grid" }, ...LIMIT_FIELDS.map(([name, label]) => h("label", {}, label, inputs[name]))),
    h("div", { class: "row" },
      h("button", { type: "submit", class: "save-limits" }, "Save limits"),
      h("button", { type: "button", class: "danger remove-limits", onclick: remove }, "Remove limits"),
      h("button", { type: "button", class: "secondary", onclick: () => done() }, "Cancel")));
}

// The queues; `ctx.admin` adds an Edit button per queue and a "limit a queue" field.
// A queue whose form is open is left as it is until the form closes.
export function showQueues(body, ctx) {
  if (ctx.editing != null) return;  // a form is open: the next refresh after it closes
  const list = document.getElementById("queue-list");
  const items = body.queues.map((q) => {
    const counts = Object.entries(q.counts).map(([s, n]) =>
      h("span", { class: `count status-${s}`, "data-status": s }, `${n} ${s}`));
    const edit = ctx.admin
      ? h("button", { type: "button", class: "secondary edit-queue", onclick: () => openLimits(q, ctx) }, "Edit")
      : null;
    return h("li", { class: "queue", "data-queue": q.name },
      h("span", { class: "queue-name" }, q.name),
      h("span", { class: "queue-counts" }, counts.length ? counts : h("span", { class: "none" }, "no tasks")),
      h("span", { class: "queue-limits" }, queueLimits(q)), edit);
  });
  list.replaceChildren(...items);
  document.getElementById("queues-counted").textContent = body.counts_of === "everyone" ? "(everyone's tasks)" : "(my tasks)";
  document.getElementById("queues-readonly").hidden = ctx.admin;
  const adminBox = document.getElementById("queue-admin");
  adminBox.hidden = !ctx.admin;
  if (ctx.admin && !adminBox.childElementCount) {
    const name = h("input", { id: "new-queue", placeholder: "queue name", "aria-label": "Queue to limit", maxlength: "200" });
    adminBox.append(h("form", { class: "row", onsubmit: (ev) => {
      ev.preventDefault();
      const n = name.value.trim();
      if (!n) return;
      name.value = "";
      openLimits(body.queues.find((q) => q.name === n) || { name: n, counts: {} }, ctx);
    } }, name, h("button", { type: "submit", class: "secondary" }, "Limit a queue")));
  }
}

function openLimits(q, ctx) {
  ctx.editing = q.name;
  const list = document.getElementById("queue-list");
  let li = list.querySelector(`.queue[data-queue="${CSS.escape(q.name)}"]`);
  if (!li) { li = h("li", { class: "queue", "data-queue": q.name }, h("span", { class: "queue-name" }, q.name)); list.append(li); }
  li.querySelector(".limits-form")?.remove();
  li.append(limitsForm(q, { ...ctx, done: () => { ctx.editing = null; ctx.refresh(); } }));
}

// --- schedules ------------------------------------------------------------------

function scheduleForm(s, agents, { api, toast, problemText, done }) {
  const name = h("input", { name: "name", "aria-label": "Schedule name", maxlength: "200", required: true });
  const agent = h("select", { name: "agent", "aria-label": "Agent" }, ...agents.map((a) => h("option", { value: a }, a)));
  const every = h("input", { name: "every", type: "number", min: "1", step: "any", "aria-label": "Every (seconds)" });
  const cron = h("input", { name: "cron", placeholder: "*/5 * * * *", "aria-label": "Cron (UTC)" });
  const input = h("textarea", { name: "input", rows: 2, "aria-label": "Input of each task" });
  if (s) {
    name.value = s.name; name.readOnly = true;
    if (![...agent.options].some((o) => o.value === s.agent)) agent.append(h("option", { value: s.agent }, s.agent));
    agent.value = s.agent;
    every.value = s.every ?? ""; cron.value = s.cron ?? "";
    input.value = s.input == null ? "" : typeof s.input === "string" ? s.input : JSON.stringify(s.input);
  }
  const save = async (ev) => {
    ev.preventDefault();
    let value = input.value;
    if (s && typeof s.input !== "string" && s.input != null) {  // it was JSON: it stays JSON
      try { value = JSON.parse(input.value); } catch { toast("The input was JSON; it must stay valid JSON."); return; }
    }
    if (value === "") value = null;
    const body = { ...(s ? { overlap: s.overlap, queue: s.queue, priority: s.priority, metadata: s.metadata } : {}),
      name: name.value.trim(), agent: agent.value, input: value };
    if (every.value) body.every = Number(every.value); else body.cron = cron.value.trim() || null;
    try {
      const saved = await api("POST", "/v1/schedules", body);
      // POST replaces the schedule, and a new one ticks: a paused one is paused again.
      if (s?.paused && !saved.paused) await api("POST", `/v1/schedules/${enc(saved.name)}/pause`);
      done();
    } catch (err) { toast(problemText(err)); }
  };
  return h("form", { class: "schedule-form card", onsubmit: save },
    h("label", {}, "Name", name), h("label", {}, "Agent", agent),
    h("label", {}, "Every (seconds)", every), h("label", {}, "or cron (UTC)", cron),
    h("label", {}, "Input", input),
    h("div", { class: "row" },
      h("button", { type: "submit", class: "save-schedule" }, s ? "Save schedule" : "Create schedule"),
      h("button", { type: "button", class: "secondary", onclick: () => done() }, "Cancel")));
}

// My schedules with pause/resume, edit (POST replaces it by name) and delete.
export function showSchedules(body, ctx) {
  const list = document.getElementById("schedule-list");
  const slot = document.getElementById("schedule-editor-slot");
  const act = (path, method = "POST") => async () => {
    try { await ctx.api(method, path); ctx.refresh(); } catch (err) { ctx.toast(ctx.problemText(err)); }
  };
  const edit = (s) => () => {
    ctx.editing = s ? s.name : "";
    slot.replaceChildren(scheduleForm(s, ctx.agents, { ...ctx, done: () => { ctx.editing = null; slot.replaceChildren(); ctx.refresh(); } }));
  };
  const items = body.schedules.map((s) => h("li", { class: "schedule", "data-schedule": s.name, "data-paused": String(s.paused) },
    h("div", { class: "row" }, h("span", { class: "schedule-name" }, s.name), h("span", { class: "agent" }, s.agent),
      h("span", { class: `badge ${s.paused ? "status-paused" : "status-running"}` }, s.paused ? "paused" : "ticking")),
    h("div", { class: "meta schedule-when" }, s.every != null ? `every ${seconds(s.every)}` : `cron ${s.cron}`,
      ` · next ${new Date(s.next_at).toLocaleString()}`),
    s.last_task_id ? h("div", { class: "meta" }, "last task ", h("a", { href: `#task=${enc(s.last_task_id)}` }, s.last_task_id)) : null,
    h("div", { class: "row actions" },
      h("button", { type: "button", class: "secondary", onclick: act(`/v1/schedules/${enc(s.name)}/${s.paused ? "resume" : "pause"}`) },
        s.paused ? "Resume" : "Pause"),
      h("button", { type: "button", class: "secondary edit-schedule", onclick: edit(s) }, "Edit"),
      h("button", { type: "button", class: "danger", onclick: () => {
        if (confirm(`Delete schedule ${s.name}? The tasks it started stay.`)) act(`/v1/schedules/${enc(s.name)}`, "DELETE")();
      } }, "Delete"))));
  list.replaceChildren(...items, h("li", { class: "new-schedule" },
    h("button", { type: "button", class: "secondary", onclick: edit(null) }, "New schedule")));
  if (!items.length) list.prepend(h("li", { class: "empty" }, "No schedules."));
}
