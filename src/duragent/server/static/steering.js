// Steering a task from the page: its rounds (GET /history) with "Fork from here"
// on every complete round (POST /fork), a fork being a new task the page opens;
// and a message box on a live task (POST /messages).

import { h } from "./timeline.js";

function clip(text, n) {
  const s = String(text ?? "").replace(/\s+/g, " ").trim();
  return s.length <= n ? s : s.slice(0, n - 1) + "…";
}

function roundItem(r, onPick, compacted) {
  const calls = r.calls.map((c) =>
    h("div", { class: "round-call", "data-outcome": c.outcome || "open" },
      `${c.name} → ${c.outcome || "no result yet"}`, c.result ? `: ${clip(c.result, 80)}` : ""));
  const said = [
    ...r.user.map((u) => h("div", { class: "round-user" }, `user: ${clip(u, 100)}`)),
    r.assistant ? h("div", { class: "round-said" }, clip(r.assistant, 160)) : null,
    // The agent that ran the round, and where a handoff took the task from there.
    r.agent ? h("div", { class: "round-agent" }, r.handoff
      ? `${r.agent} → handed off to ${r.handoff.to_agent}` : r.agent) : null,
  ];
  const fork = r.status === "complete"
    ? h("button", { type: "button", class: "secondary fork", "data-round": r.round, onclick: () => onPick(r) }, "Fork from here")
    : null;
  return h("li", { class: `round round-${r.status}`, "data-round": r.round, "data-status": r.status },
    h("div", { class: "round-head" },
      h("span", { class: "round-no" }, `Round ${r.round}`),
      h("span", { class: "round-status" }, r.status + (r.voided && r.status !== "voided" ? " · rolled back once" : "")
        + (r.round <= compacted ? " · compacted in the model's view" : "")),
      fork),
    ...said, ...calls);
}

// Render the task's rounds into `list`; "Fork from here" opens the fork editor.
export async function showRounds(api, taskId, list) {
  const hist = await api("GET", `/v1/tasks/${encodeURIComponent(taskId)}/history`);
  // Rounds up to the last compaction's are summarised (or elided) in the model's view.
  const compacted = Math.max(0, ...(hist.compactions || []).map((c) => c.to_round));
  const items = hist.rounds.map((r) => roundItem(r, pickRound, compacted));
  list.replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No rounds yet.")]));
  return hist;
}

// Send `text` into the task (POST /messages); `strategy` "" means the task's own.
// `requestId` makes a repeat harmless: the server takes one message per id.
export async function sendMessage(api, taskId, text, strategy, requestId) {
  const body = { text, request_id: requestId };
  if (strategy) body.multitask_strategy = strategy;
  return api("POST", `/v1/tasks/${encodeURIComponent(taskId)}/messages`, body);
}

// A random request id (crypto.randomUUID needs a secure context; this does not).
export function newRequestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "page-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// --- time travel: pick a round, edit, fork --------------------------------------

const $ = (id) => document.getElementById(id);

// The editor for a fork at round `r`: "redo" puts the edited text in place of the
// round's (last) user message and drops the round's answer, so the fork asks the
// model again from there; "continue" keeps the round and adds a message after it.
export function pickRound(r) {
  const form = $("fork-editor");
  const said = r.user.length ? r.user[r.user.length - 1] : null;
  form.dataset.round = String(r.round);
  form.dataset.said = said ?? "";
  form.dataset.requestId = newRequestId();  // a second click makes no second fork
  $("fork-round").textContent = `round ${r.round}`;
  $("fork-redo").disabled = said == null;
  $("fork-redo").checked = said != null;
  $("fork-continue").checked = said == null;
  $("fork-message").value = said ?? "";
  form.hidden = false;
  $("fork-message").focus();
}

export function forkModeChanged() {
  const form = $("fork-editor");
  const redo = $("fork-redo").checked;
  const box = $("fork-message");
  box.value = redo ? form.dataset.said : "";
  box.placeholder = redo ? "The round's message, edited" : "Optional message for the fork to continue with";
}

export function closeForkEditor() {
  $("fork-editor").hidden = true;
  $("fork-message").value = "";
}

// POST /fork for what the editor holds: the new task (the caller opens it).
export async function forkFromEditor(api, taskId) {
  const form = $("fork-editor");
  const text = $("fork-message").value.trim();
  const redo = $("fork-redo").checked;
  if (redo && !text) throw new Error("Redoing the round needs its message: write one.");
  const edit = redo ? { drop_last_assistant: true, replace_last_user: text } : text ? { append_user: text } : null;
  const body = { at_round: Number(form.dataset.round), edit, request_id: form.dataset.requestId };
  return api("POST", `/v1/tasks/${encodeURIComponent(taskId)}/fork`, body);
}
