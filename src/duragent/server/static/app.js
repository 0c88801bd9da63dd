// The duragent web page: sign in, list my tasks, start one, watch one live.
// A reload (or a reopened tab) rebuilds the open task from its committed
// entries over REST, then resumes the event stream after the last seq.

import { follow, HttpError } from "./sse.js";
import { h, Timeline } from "./timeline.js";
import { closeForkEditor, forkFromEditor, forkModeChanged, newRequestId, sendMessage, showRounds } from "./steering.js";
import { badMeta, currentFilter, describeFilter, filterQuery, hashFor, hashParams, showFilter } from "./filters.js";
import { showCounts, showQueues, showSchedules } from "./fleet.js";
import { setUpBulk, showOperations } from "./bulk.js";

const TOKEN_KEY = "duragent.token";
const AGENT_KEY = "duragent.agent";
const ACTIVE = new Set(["pending", "running", "waiting", "paused"]);
const $ = (sel) => document.querySelector(sel);

// The token lives in this tab's session storage: it survives a reload but not the
// tab, and no other tab or later visitor of the browser profile can read it.
localStorage.removeItem(TOKEN_KEY); // left there by older versions of this page

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  taskId: null,
  task: null,
  stopFollowing: null,
  timeline: null,
  listTimer: null,
  refreshTimer: null,
  roundsAt: null,
  leaseTimer: null,
  leaseChecked: null,  // the lease end the task was fetched again for
  workerChecked: null,  // the worker's check-in deadline the task was fetched again for
  user: null,  // GET /v1/me: who is signed in (a bulk action acts on their own tasks)
  bulkTimer: null,  // polls the bulk operations each second while one runs
  admin: false,  // GET /v1/me: may change queue limits (the page shows those controls)
  agents: [],  // the agents' names, from GET /v1/agents
  view: "tasks",  // the sidebar's view: tasks, counts, queues, schedules, bulk
  cursors: [null],  // the task list's pages: the cursor of each one seen, newest first
  fleet: { editing: null },  // the queue or schedule whose form is open
};

// For the console (and the bulk actions added to #bulk-actions): the current filter
// as the REST names it, e.g. { status: ["failed"], agent: "quick", meta: ["team:red"] }.
window.duragent = { filter: currentFilter };

// --- HTTP -------------------------------------------------------------------

async function api(method, path, body) {
  const opts = { method, headers: { Authorization: `Bearer ${state.token}` } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  const data = res.headers.get("content-type")?.includes("json") ? await res.json() : null;
  if (!res.ok) {
    if (res.status === 401) signOut("Your token is no longer valid; sign in again.");
    throw new HttpError(res.status, data);
  }
  return data;
}

function toast(message, kind = "error") {
  const el = h("div", { class: `toast ${kind}` }, message);
  $("#toasts").append(el);
  setTimeout(() => el.remove(), 6000);
}

function problemText(err) {
  const p = err.problem;
  return p ? `${p.title}${p.detail ? ": " + p.detail : ""}` : String(err.message || err);
}

// --- sign in ----------------------------------------------------------------

async function signIn(token) {
  state.token = token;
  try {
    const me = await api("GET", "/v1/me");
    sessionStorage.setItem(TOKEN_KEY, token);
    $("#user").textContent = me.user;
    state.user = me.user;
    state.admin = me.admin === true;
    showApp();
  } catch (err) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    $("#signin-error").textContent =
      err instanceof HttpError && err.status === 401 ? "That token is not valid." : problemText(err);
  }
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  closeTask();
  clearInterval(state.listTimer);
  $("#app").hidden = true;
  $("#signin").hidden = false;
  $("#signin-error").textContent = message || "";
}

async function showApp() {
  $("#signin").hidden = true;
  $("#app").hidden = false;
  await loadAgents();
  const params = hashParams();
  showFilter(params);
  showView(params.get("view") || "tasks");
  await refreshList();
  clearInterval(state.listTimer);
  state.listTimer = setInterval(refreshList, 2000);
  const id = params.get("task");
  if (id) openTask(id);
}

// The URL: the filter, the open task, the view (a link opens the same console).
function writeHash() {
  const view = state.view === "tasks" ? null : state.view;
  history.replaceState(null, "", hashFor(currentFilter(), { task: state.taskId, view }));
}

function showView(view) {
  state.fleet.editing = null;  // a form left open in another view is dropped
  $("#schedule-editor-slot").replaceChildren();
  state.view = ["tasks", "counts", "queues", "schedules", "bulk"].includes(view) ? view : "tasks";
  for (const el of document.querySelectorAll(".view")) el.hidden = el.dataset.view !== state.view;
  for (const b of document.querySelectorAll(".view-tab")) b.setAttribute("aria-pressed", String(b.dataset.view === state.view));
  writeHash();
}

// --- agents and new tasks ---------------------------------------------------

const NO_AGENTS =
  "This server has no agents, so no task can start here. Restart it with " +
  "duragent serve --agents module:attr (e.g. --agents myagents:AGENTS).";

async function loadAgents() {
  const { agents } = await api("GET", "/v1/agents");
  state.agents = agents.map((a) => a.name);
  $("#filter-agent").replaceChildren(h("option", { value: "" }, "any agent"),
    ...agents.map((a) => h("option", { value: a.name }, a.name)));
  const select = $("#agent");
  select.replaceChildren(...agents.map((a) => h("option", { value: a.name }, a.name)));
  const none = agents.length === 0;
  for (const el of [select, $("#input"), $("#start")]) el.disabled = none;
  $("#agent-tools").classList.toggle("error-text", none);
  if (none) { $("#agent-tools").textContent = NO_AGENTS; return; }
  const remembered = localStorage.getItem(AGENT_KEY);
  if (agents.some((a) => a.name === remembered)) select.value = remembered;
  const describe = () => {
    const a = agents.find((x) => x.name === select.value);
    $("#agent-tools").textContent = a && a.tools.length
      ? "Tools: " + a.tools.map((t) => `${t.name}${t.requires_approval === true ? " (asks first)" : ""}`).join(", ")
      : "No tools.";
  };
  select.onchange = () => { localStorage.setItem(AGENT_KEY, select.value); describe(); };
  describe();
}

async function startTask(ev) {
  ev.preventDefault();
  if (!$("#agent").value) { toast(NO_AGENTS); return; }
  const input = $("#input").value.trim();
  if (!input) { $("#input").focus(); return; }
  const button = $("#start");
  button.disabled = true;
  try {
    const task = await api("POST", "/v1/tasks", { agent: $("#agent").value, input });
    $("#input").value = "";
    await refreshList();
    openTask(task.id);
  } catch (err) {
    toast(problemText(err));
  } finally {
    button.disabled = false;
  }
}

// --- the task list ----------------------------------------------------------

function ago(iso) {
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.floor(s)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return new Date(iso).toLocaleDateString();
}

let listAsked = 0;

// The list for the filter, the page of it shown, and the open view's numbers.
async function refreshList() {
  if (!state.token) return;
  const filter = currentFilter();
  const bad = badMeta(filter.meta || []);
  $("#filter-summary").textContent = bad ? `metadata ${bad} should be key:value` : describeFilter(filter);
  $("#filter-summary").classList.toggle("error-text", bad !== null);
  if (bad) return;
  const query = filterQuery(filter);
  query.set("limit", "50");
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor) query.set("cursor", cursor);
  let page, counts;
  const asked = ++listAsked;  // a slower answer to an older filter must not win
  try {
    [page, counts] = await Promise.all([api("GET", `/v1/tasks?${query}`), api("GET", "/v1/counts")]);
  } catch (err) {
    if (asked === listAsked && err instanceof HttpError && err.status === 422) $("#filter-summary").textContent = problemText(err);
    return;
  }
  if (asked !== listAsked) return;
  renderCounts(counts);
  renderPage(page, Object.keys(filter).length > 0);
  refreshView().catch(() => { /* the next refresh retries */ });
}

function renderPage(page, filtered) {
  state.nextCursor = page.next_cursor;
  $("#page-older").disabled = !page.next_cursor;
  $("#page-newer").disabled = state.cursors.length < 2;
  $("#page-no").textContent = state.cursors.length > 1 || page.next_cursor ? `page ${state.cursors.length}` : "";
  const list = $("#tasks");
  if (!page.tasks.length) {
    list.replaceChildren(h("li", { class: "empty" }, filtered ? "No tasks match." : "No tasks yet. Start one above."));
    return;
  }
  list.replaceChildren(...page.tasks.map((t) => h("li", {
    class: `task-item${t.id === state.taskId ? " selected" : ""}`,
    "data-id": t.id,
    onclick: () => openTask(t.id),
  },
  h("div", { class: "row" }, h("span", { class: "agent" }, t.agent), badge(t.status, t.status_reason, t.waiting_on)),
  // Pending on a version no live worker serves: said, never a silent "pending".
  t.unserved ? h("div", { class: "unserved" }, t.unserved) : "",
  h("div", { class: "meta" }, t.current_step ? `step ${t.current_step} · ` : "", ago(t.created_at), " · ",
    t.queue ? `${t.queue} · ` : "", t.id.slice(0, 10)))));
}

// The filter changed: back to its first page, and into the URL.
function filterChanged() {
  state.cursors = [null];
  writeHash();
  refreshList();
}

// The open view's numbers: counts per agent, queues, schedules.
async function refreshView() {
  const ctx = { api, toast, problemText, admin: state.admin, agents: state.agents, refresh: () => refreshView() };
  Object.assign(state.fleet, ctx);
  if (state.view === "counts") {
    await showCounts(api, state.agents, $("#counts-table"), pickCount);
  } else if (state.view === "queues") {
    showQueues(await api("GET", "/v1/queues"), state.fleet);
  } else if (state.view === "schedules" && state.fleet.editing == null) {
    showSchedules(await api("GET", "/v1/schedules"), state.fleet);
  } else if (state.view === "bulk") {
    await refreshBulk();
  }
}

// The bulk operations; while one runs, again each second (live progress).
async function refreshBulk() {
  clearTimeout(state.bulkTimer);
  const running = showOperations(await api("GET", "/v1/bulk?limit=50"), $("#bulk-list"));
  if (running && state.view === "bulk") {
    state.bulkTimer = setTimeout(() => refreshBulk().catch(() => { /* the list refresh retries */ }), 1000);
  }
}

// A confirmed bulk action started: show it in the operations view.
function bulkStarted() {
  showView("bulk");
  refreshList();
}

// A number in the counts table: list those tasks.
function pickCount({ agent, status }) {
  showFilter(new URLSearchParams({ ...(agent ? { agent } : {}), ...(status ? { status } : {}) }));
  showView("tasks");
  filterChanged();
}

// Totals per status over every queue, and per queue when there is more than one.
function renderCounts(body) {
  const byStatus = {};
  for (const row of Object.values(body.counts)) {
    for (const [s, n] of Object.entries(row)) byStatus[s] = (byStatus[s] || 0) + n;
  }
  const parts = Object.entries(byStatus).map(([s, n]) => h("span", { class: `count status-${s}`, "data-status": s }, `${n} ${s}`));
  const queues = Object.keys(body.counts);
  if (queues.length > 1) parts.push(h("span", { class: "count-queues" }, `in ${queues.length} queues`));
  $("#counts").replaceChildren(...parts);
}

function badge(status, reason, waits) {
  return h("span", { class: `badge status-${status}`, "data-status": status }, statusText(status, reason, waits));
}

// An approval and a question are both status_reason "input": say which, and
// which tool an approval is for.
function statusText(status, reason, waits) {
  if (status === "waiting" && waits?.length) {
    const tools = [...new Set(waits.filter((w) => w.wait === "approval").map((w) => w.tool || "a tool"))];
    if (tools.length) return `waiting for approval · ${tools.join(", ")}`;
    if (waits.some((w) => w.wait === "input")) return "waiting for your answer";
  }
  return status + (reason ? ` · ${reason}` : "");
}

// --- one task ---------------------------------------------------------------

function closeTask() {
  clearInterval(state.leaseTimer);
  if (state.stopFollowing) state.stopFollowing();
  state.stopFollowing = null;
  state.taskId = null;
  state.task = null;
}

async function openTask(id) {
  closeTask();
  state.taskId = id;
  closeForkEditor();
  writeHash();
  document.querySelectorAll(".task-item").forEach((el) => el.classList.toggle("selected", el.dataset.id === id));
  $("#empty").hidden = true;
  $("#task").hidden = false;
  // One column (a phone): the task opens below the list and the form; bring it up.
  if (matchMedia("(max-width: 800px)").matches) $(".detail").scrollIntoView();
  $("#conn").textContent = "loading…";
  const timeline = new Timeline($("#timeline"), { respond });
  state.timeline = timeline;
  try {
    renderTask(await api("GET", `/v1/tasks/${encodeURIComponent(id)}`));
    // Everything committed so far, page by page...
    for (;;) {
      const page = await api("GET", `/v1/tasks/${encodeURIComponent(id)}/entries?after=${timeline.lastSeq}&limit=1000`);
      if (state.taskId !== id) return;
      page.entries.forEach((e) => timeline.apply(e));
      if (page.entries.length < 1000) break;
    }
  } catch (err) {
    $("#conn").textContent = "";
    if (err instanceof HttpError && err.status === 404) {
      $("#task").hidden = true;
      $("#empty").hidden = false;
      $("#empty").textContent = "That task does not exist (or is not yours).";
      state.taskId = null;
      writeHash();
    } else toast(problemText(err));
    return;
  }
  scrollDown();
  // ...then live, from the last seq seen.
  state.stopFollowing = follow(`/v1/tasks/${encodeURIComponent(id)}/events`, {
    token: state.token,
    afterSeq: timeline.lastSeq,
    onEvent: (ev) => {
      if (state.taskId !== id) return;
      const near = nearBottom();
      timeline.apply(ev.data);
      if (near) scrollDown();
      if (["status", "api_message", "tool_result", "checkpoint"].includes(ev.event)) refreshTaskSoon();
    },
    onState: (s) => {
      if (state.taskId !== id) return;
      $("#conn").textContent = { live: "● live", ended: "", reconnecting: "reconnecting…" }[s];
      $("#conn").className = `conn ${s}`;
      if (s === "ended") refreshTaskSoon();
    },
    onFatal: (err) => toast(problemText(err)),
  });
}

function refreshTaskSoon() {
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(async () => {
    const id = state.taskId;
    if (!id) return;
    try {
      const task = await api("GET", `/v1/tasks/${encodeURIComponent(id)}`);
      if (state.taskId === id) renderTask(task);
    } catch { /* the next event retries */ }
    refreshList();
  }, 150);
}

function renderTask(task) {
  state.task = task;
  $("#task-agent").textContent = task.agent;
  $("#task-version").textContent = task.agent_version ? `@${task.agent_version}` : "";
  $("#unserved").textContent = task.unserved || "";
  $("#unserved").hidden = !task.unserved;
  $("#task-id").textContent = task.id;
  $("#task-input").textContent = typeof task.input === "string" ? task.input : JSON.stringify(task.input);
  $("#status").replaceChildren(badge(task.status, task.status_reason, task.waiting_on));
  $("#status").dataset.status = task.status;
  $("#task").dataset.status = task.status;  // e.g. no typing cursor on a paused stream
  const step = $("#step");
  step.dataset.step = task.current_step ?? task.iterations;
  step.textContent = task.current_step
    ? `Step ${task.current_step}`
    : `${task.iterations} step${task.iterations === 1 ? "" : "s"}`;
  $("#usage").textContent = `${task.usage.input_tokens} in · ${task.usage.output_tokens} out tokens`;
  // The wall-clock limit; once passed, an active task fails at its next safe point.
  const deadline = $("#deadline");
  deadline.hidden = !task.deadline;
  deadline.dataset.deadline = task.deadline || "";
  deadline.textContent = task.deadline ? `Deadline ${new Date(task.deadline).toLocaleString()}` : "";
  showLease(task);
  $("#task-error").textContent = task.error || "";
  $("#task-error").hidden = !task.error;
  // A structured answer (an agent's output_type): its JSON, pretty-printed.
  const structured = task.output != null && typeof task.output !== "string";
  $("#task-output-panel").hidden = !structured;
  $("#task-output").textContent = structured ? JSON.stringify(task.output, null, 2) : "";
  const src = task.forked_from;
  $("#forked-from").hidden = !src;
  $("#forked-from").replaceChildren(...(src ? [
    "Forked from ", h("a", { href: `#task=${encodeURIComponent(src.task_id)}` }, src.task_id),
    ` at round ${src.round}`] : []));
  if (state.roundsAt !== `${task.id}:${task.last_seq}`) {
    state.roundsAt = `${task.id}:${task.last_seq}`;
    showRounds(api, task.id, $("#rounds")).catch(() => { /* the next render retries */ });
  }
  // Several approvals open: decide them all in one request (one commit).
  const approvals = (task.waiting_for || []).filter((w) => w.wait === "approval");
  $("#approvals-bar").hidden = approvals.length < 2;
  $("#approvals-count").textContent = `${approvals.length} calls wait for approval`;
  const s = task.status;
  $("#pause").disabled = !["pending", "running", "waiting"].includes(s);
  $("#rollback").disabled = $("#pause").disabled;
  $("#resume").disabled = !["paused", "blocked"].includes(s);
  $("#retry").hidden = s !== "failed";
  $("#retry").disabled = s !== "failed";
  $("#abort").disabled = !(ACTIVE.has(s) || s === "blocked");
  $("#migrate").disabled = !(ACTIVE.has(s) || s === "blocked");  // an ended task runs on no version
  $("#send-form").hidden = !(ACTIVE.has(s) || s === "blocked");  // a live task takes messages
}

// A running task is held by its worker's lease. A live worker renews it long
// before it ends; if the worker died (a crash), nobody may take the task over
// before it ends. The worker's own check-ins (lease_worker_seen_at) tell the
// two apart: alive, or gone with the lease still running (how long), or the
// lease ended and the task waits for another worker.
function showLease(task) {
  clearInterval(state.leaseTimer);
  const el = $("#lease");
  const until = task.status === "running" && task.lease_expires_at
    ? new Date(task.lease_expires_at).getTime() : null;
  el.hidden = until === null;
  el.dataset.until = task.lease_expires_at || "";
  if (until === null) return;
  const seen = task.lease_worker_seen_at ? new Date(task.lease_worker_seen_at).getTime() : null;
  const goneAfter = task.lease_worker_gone_after ? new Date(task.lease_worker_gone_after).getTime() : null;
  const tick = () => {
    const now = Date.now();
    const left = Math.ceil((until - now) / 1000);
    const silent = Math.max(0, Math.floor((now - seen) / 1000));
    if (left > 0 && goneAfter !== null && now < goneAfter) {
      el.dataset.state = "alive";
      el.textContent = `Its worker is alive (checked in ${silent} s ago) and holds the task; ` +
        "it renews the lease while it runs";
    } else if (left > 0 && goneAfter !== null && state.workerChecked !== task.lease_worker_gone_after) {
      state.workerChecked = task.lease_worker_gone_after;  // checked in meanwhile? fetch once
      refreshTaskSoon();
    } else if (left > 0 && goneAfter !== null) {
      el.dataset.state = "gone";
      el.textContent = `Its worker has not checked in for ${silent} s: it is probably gone (crashed or cut off). ` +
        `Its lease ends in ${left} s; then another worker takes the task over`;
    } else if (left > 0) {
      el.dataset.state = "held";
      el.textContent = `Its worker's lease holds it ${left} s more (renewed while that worker lives; ` +
        "after a crash, another worker takes it over when it ends)";
    } else if (state.leaseChecked !== task.lease_expires_at) {
      state.leaseChecked = task.lease_expires_at;  // renewed meanwhile? fetch the task once
      refreshTaskSoon();
    } else {
      el.dataset.state = "expired";
      el.textContent = "Its worker's lease has expired (that worker is gone): " +
        "waiting for another worker to take it over";
    }
  };
  tick();
  state.leaseTimer = setInterval(tick, 1000);
}

// The message being sent: sending the same text to the same task again after
// an unanswered attempt (the connection dropped, the server failed) reuses its
// request id, so the task takes the message once even if the first one landed.
let unsent = null;  // { taskId, text, requestId }

async function sendToTask(ev) {
  ev.preventDefault();
  const text = $("#send-text").value;
  if (!text.trim()) return;
  if (!unsent || unsent.taskId !== state.taskId || unsent.text !== text) {
    unsent = { taskId: state.taskId, text, requestId: newRequestId() };
  }
  $("#send").disabled = true;
  try {
    const task = await sendMessage(api, state.taskId, text, $("#send-strategy").value, unsent.requestId);
    unsent = null;
    $("#send-text").value = "";
    if (state.taskId === task.id) renderTask(task);
  } catch (err) {
    // A refusal (4xx) means nothing was taken: a new try is a new message.
    if (err instanceof HttpError && err.status < 500) unsent = null;
    toast(problemText(err));
  } finally {
    $("#send").disabled = false;
  }
}

async function control(action, body, button) {
  const id = state.taskId;
  const label = button.textContent;
  button.disabled = true;
  button.textContent = { pause: "Pausing…", resume: "Resuming…", abort: "Aborting…", retry: "Retrying…", migrate: "Migrating…" }[action] || label;
  try {
    const task = await api("POST", `/v1/tasks/${encodeURIComponent(id)}/${action}`, body);
    // A retried task lives again: its event stream had ended, so follow it anew.
    if (state.taskId === id && action === "retry") openTask(id);
    else if (state.taskId === id) renderTask(task);
    refreshList();
  } catch (err) {
    toast(problemText(err));
    refreshTaskSoon();
  } finally {
    button.textContent = label;
  }
}

// Time travel: fork at the round picked in the editor, then open the fork.
async function forkTask(ev) {
  ev.preventDefault();
  const button = $("#fork-go");
  button.disabled = true;
  try {
    const task = await forkFromEditor(api, state.taskId);
    closeForkEditor();
    await refreshList();
    openTask(task.id);
  } catch (err) {
    toast(problemText(err));
  } finally {
    button.disabled = false;
  }
}



async function decideAll(approve, button) {
  const open = (state.task?.waiting_for || []).filter((w) => w.wait === "approval");
  const decisions = Object.fromEntries(open.map((w) => [w.call_id, { approve }]));
  button.disabled = true;
  try {
    renderTask(await api("POST", `/v1/tasks/${encodeURIComponent(state.taskId)}/respond`, { decisions }));
  } catch (err) {
    toast(problemText(err));
    refreshTaskSoon();
  } finally {
    button.disabled = false;
  }
}

async function respond(callId, body) {
  try {
    const task = await api("POST", `/v1/tasks/${encodeURIComponent(state.taskId)}/respond`, { ...body, call_id: callId });
    renderTask(task);
    return true;
  } catch (err) {
    toast(problemText(err));
    return false;
  }
}

function nearBottom() {
  const el = $("#timeline-scroll");
  return el.scrollHeight - el.scrollTop - el.clientHeight < 80;
}

function scrollDown() {
  const el = $("#timeline-scroll");
  el.scrollTop = el.scrollHeight;
}

// --- wiring -----------------------------------------------------------------

$("#signin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("#token").value.trim();
  if (token) signIn(token);
});
$("#signout").addEventListener("click", () => signOut());
$("#new-task").addEventListener("submit", startTask);
$("#send-form").addEventListener("submit", sendToTask);
$("#send-text").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) sendToTask(ev);
});
$("#filters").addEventListener("change", filterChanged);
$("#filters").addEventListener("input", (ev) => { if (ev.target.type !== "datetime-local") filterChanged(); });
$("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); filterChanged(); });
$("#filter-clear").addEventListener("click", () => { showFilter(new URLSearchParams()); filterChanged(); });
$("#page-older").addEventListener("click", () => {
  if (state.nextCursor) { state.cursors.push(state.nextCursor); refreshList(); }
});
$("#page-newer").addEventListener("click", () => {
  if (state.cursors.length > 1) { state.cursors.pop(); refreshList(); }
});
for (const tab of document.querySelectorAll(".view-tab")) {
  tab.addEventListener("click", () => { showView(tab.dataset.view); refreshList(); });
}
setUpBulk({ api, problemText, filter: currentFilter, user: () => state.user, started: bulkStarted });
$("#fork-editor").addEventListener("submit", forkTask);
$("#fork-cancel").addEventListener("click", closeForkEditor);
for (const radio of document.querySelectorAll('input[name="fork-mode"]')) radio.addEventListener("change", forkModeChanged);
$("#input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) startTask(ev);
});
$("#pause").addEventListener("click", (ev) => control("pause", { rollback: false }, ev.currentTarget));
$("#rollback").addEventListener("click", (ev) => control("pause", { rollback: true }, ev.currentTarget));
$("#resume").addEventListener("click", (ev) => control("resume", undefined, ev.currentTarget));
$("#retry").addEventListener("click", (ev) => control("retry", undefined, ev.currentTarget));
$("#migrate").addEventListener("click", (ev) => {
  const to = prompt(`Move this task from ${state.task?.agent}@${state.task?.agent_version || "any"} to version:`);
  if (to && to.trim()) control("migrate", { to_version: to.trim() }, ev.currentTarget);
});
$("#approve-all").addEventListener("click", (ev) => decideAll(true, ev.currentTarget));
$("#deny-all").addEventListener("click", (ev) => decideAll(false, ev.currentTarget));
$("#abort").addEventListener("click", (ev) => {
  if (confirm("Abort this task for good?")) control("abort", { reason: "aborted from the web page" }, ev.currentTarget);
});
// A link followed or pasted in this tab: its filter, view and task.
window.addEventListener("hashchange", () => {
  if (!state.token) return;
  const params = hashParams();
  const id = params.get("task");
  if ([...params.keys()].some((k) => k !== "task")) {  // a console link: its filter and view
    showFilter(params);
    state.cursors = [null];
    showView(params.get("view") || "tasks");
    refreshList();
  }
  if (id && id !== state.taskId) openTask(id);
  else writeHash();  // a bare #task=… link keeps the filter in the URL
});

if (state.token) signIn(state.token);
else $("#signin").hidden = false;
