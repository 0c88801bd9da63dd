// The duragent web page: sign in, list my tasks, start one, watch one live.
// A reload (or a reopened tab) rebuilds the open task from its committed
// entries over REST, then resumes the event stream after the last seq.

import { follow, HttpError } from "./sse.js";
import { h, Timeline } from "./timeline.js";
import { newRequestId, sendMessage, showRounds } from "./steering.js";

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
};

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
  await refreshList();
  clearInterval(state.listTimer);
  state.listTimer = setInterval(refreshList, 2000);
  const id = new URLSearchParams(location.hash.slice(1)).get("task");
  if (id) openTask(id);
}

// --- agents and new tasks ---------------------------------------------------

const NO_AGENTS =
  "This server has no agents, so no task can start here. Restart it with " +
  "duragent serve --agents module:attr (e.g. --agents myagents:AGENTS).";

async function loadAgents() {
  const { agents } = await api("GET", "/v1/agents");
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

async function refreshList() {
  if (!state.token) return;
  const query = new URLSearchParams({ limit: "50" });
  const status = $("#filter-status").value, queue = $("#filter-queue").value.trim();
  if (status) query.set("status", status);
  if (queue) query.set("queue", queue);
  let page, counts, queues;
  const asked = ++listAsked;  // a slower answer to an older filter must not win
  try {
    [page, counts, queues] = await Promise.all([
      api("GET", `/v1/tasks?${query}`), api("GET", "/v1/counts"), api("GET", "/v1/queues"),
    ]);
  } catch { return; }
  if (asked !== listAsked) return;
  renderCounts(counts);
  renderQueues(queues);
  const list = $("#tasks");
  if (!page.tasks.length) {
    const filtered = status || queue;
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
  h("div", { class: "meta" }, t.current_step ? `step ${t.current_step} · ` : "", ago(t.created_at), " · ", t.id.slice(0, 10)))));
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

// Each queue with its tasks per status and its limits, read-only: an admin sets
// limits over REST (PUT /v1/queues/NAME) or the CLI (duragent queue set).
function renderQueues(body) {
  const items = body.queues.map((q) => {
    const counts = Object.entries(q.counts).map(([s, n]) =>
      h("span", { class: `count status-${s}`, "data-status": s }, `${n} ${s}`));
    return h("li", { class: "queue", "data-queue": q.name },
      h("span", { class: "queue-name" }, q.name),
      h("span", { class: "queue-counts" }, counts.length ? counts : h("span", { class: "none" }, "no tasks")),
      h("span", { class: "queue-limits" }, queueLimits(q)));
  });
  $("#queue-list").replaceChildren(...items);
  $("#queues-counted").textContent = body.counts_of === "everyone" ? "(everyone's tasks)" : "(my tasks)";
  $("#queues").hidden = !items.length;
}

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

function seconds(s) {
  if (s >= 86400 && s % 86400 === 0) return `${s / 86400} d`;
  if (s >= 3600 && s % 3600 === 0) return `${s / 3600} h`;
  if (s >= 60 && s % 60 === 0) return `${s / 60} min`;
  return `${s} s`;
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
  history.replaceState(null, "", `#task=${encodeURIComponent(id)}`);
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
      history.replaceState(null, "", "#");
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
    showRounds(api, task.id, $("#rounds"), forkTask).catch(() => { /* the next render retries */ });
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

async function forkTask(round) {
  const message = $("#fork-message").value.trim();
  const body = { at_round: round, edit: message ? { append_user: message } : null };
  try {
    const task = await api("POST", `/v1/tasks/${encodeURIComponent(state.taskId)}/fork`, body);
    $("#fork-message").value = "";
    await refreshList();
    openTask(task.id);
  } catch (err) {
    toast(problemText(err));
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
$("#filter-status").addEventListener("change", () => refreshList());
$("#filter-queue").addEventListener("input", () => refreshList());
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
window.addEventListener("hashchange", () => {
  const id = new URLSearchParams(location.hash.slice(1)).get("task");
  if (id && id !== state.taskId && state.token) openTask(id);
});

if (state.token) signIn(state.token);
else $("#signin").hidden = false;
