// Steering a task from the page: its rounds (GET /history) with "Fork from here"
// on every complete round (POST /fork), a fork being a new task the page opens;
// and a message box on a live task (POST /messages).

import { h } from "./timeline.js";

function clip(text, n) {
  const s = String(text ?? "").replace(/\s+/g, " ").trim();
  return s.length <= n ? s : s.slice(0, n - 1) + "…";
}

function roundItem(r, onFork, compacted) {
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
    ? h("button", { class: "secondary fork", "data-round": r.round, onclick: (ev) => onFork(r.round, ev.currentTarget) }, "Fork from here")
    : null;
  return h("li", { class: `round round-${r.status}`, "data-round": r.round, "data-status": r.status },
    h("div", { class: "round-head" },
      h("span", { class: "round-no" }, `Round ${r.round}`),
      h("span", { class: "round-status" }, r.status + (r.voided && r.status !== "voided" ? " · rolled back once" : "")
        + (r.round <= compacted ? " · compacted in the model's view" : "")),
      fork),
    ...said, ...calls);
}

// Render the task's rounds into `list`; `fork(round, message)` starts a fork.
export async function showRounds(api, taskId, list, fork) {
  const hist = await api("GET", `/v1/tasks/${encodeURIComponent(taskId)}/history`);
  // Rounds up to the last compaction's are summarised (or elided) in the model's view.
  const compacted = Math.max(0, ...(hist.compactions || []).map((c) => c.to_round));
  const items = hist.rounds.map((r) => roundItem(r, async (round, button) => {
    button.disabled = true;
    try { await fork(round); } finally { button.disabled = false; }
  }, compacted));
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
