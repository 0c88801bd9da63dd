// Bulk actions on the filtered list (POST /v1/bulk) and the "Bulk" view of the
// operations (GET /v1/bulk). An action first asks the server for a dry run with
// the list's filter, then asks for a confirmation that names the count and the
// filter; only a confirmed action starts an operation. Purge needs the count
// typed back; a filter with no criteria needs "all my tasks" ticked. Every text
// (filters, errors, ids) is set as text, never as markup.

import { badMeta } from "./filters.js";
import { h } from "./timeline.js";

export const BULK_ACTIONS = ["retry", "pause", "resume", "abort", "purge"];
const VERB = { retry: "Retry", pause: "Pause", resume: "Resume", abort: "Abort", purge: "Purge" };
const enc = encodeURIComponent;
const $ = (sel) => document.querySelector(sel);

// The list's filter (filters.js names) as POST /v1/bulk's `filter`: one status
// list, metadata as an object, always the signed-in user's own tasks (what the
// list shows; an admin's bulk without an owner would reach everyone's).
export function toBulkFilter(filter, owner) {
  const out = {};
  for (const [name, value] of Object.entries(filter)) {
    if (name === "meta") {
      out.metadata = {};
      for (const pair of value) {
        const at = pair.indexOf(":");
        out.metadata[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
      }
    } else out[name] = value;
  }
  if (owner) out.owner = owner;
  return out;
}

// "status failed · agent quick" (or null: no criteria at all).
export function filterWords(filter) {
  const parts = Object.entries(filter).map(([k, v]) => `${k.replace("_", " ")} ${Array.isArray(v) ? v.join(", ") : v}`);
  return parts.length ? parts.join(" · ") : null;
}

const tasks = (n) => `${n} task${n === 1 ? "" : "s"}`;

// ctx: { api, problemText, filter(), user(), started(op) }
export function setUpBulk(ctx) {
  const select = h("select", { id: "bulk-action", "aria-label": "Bulk action on the filtered tasks" },
    h("option", { value: "" }, "Bulk action…"), ...BULK_ACTIONS.map((a) => h("option", { value: a }, VERB[a])));
  const error = h("span", { id: "bulk-error", class: "error-text bulk-error", role: "alert" });
  select.addEventListener("change", () => {
    const action = select.value;
    select.value = "";
    if (action) ask(action, ctx, error).catch((err) => { error.textContent = ctx.problemText(err); });
  });
  $("#bulk-actions").replaceChildren(select, error);
  const dialog = $("#bulk-dialog");
  $("#bulk-cancel").addEventListener("click", () => dialog.close("cancel"));
}

// The dry run, then the dialog; confirmed, the operation starts.
async function ask(action, ctx, error) {
  error.textContent = "";
  const listFilter = ctx.filter();
  const bad = badMeta(listFilter.meta || []);
  if (bad) { error.textContent = `metadata ${bad} should be key:value`; return; }
  const filter = toBulkFilter(listFilter, ctx.user());
  const { count } = await ctx.api("POST", "/v1/bulk", { action, filter, dry_run: true });
  const words = filterWords(listFilter);
  const dialog = $("#bulk-dialog");
  dialog.dataset.action = action;
  dialog.dataset.count = String(count);
  $("#bulk-question").textContent = count === 0
    ? `No tasks to ${action} match: ${words ?? "all my tasks"}.`
    : `${VERB[action]} ${tasks(count)} matching: ${words ?? "all my tasks"}?`;
  $("#bulk-dialog-error").textContent = "";
  // No criteria: every task of mine; say so and make it ticked on purpose.
  const all = $("#bulk-all");
  all.checked = false;
  $("#bulk-all-row").hidden = words !== null || count === 0;
  // Purge deletes for good: the count typed back.
  const typed = $("#bulk-typed");
  typed.value = "";
  $("#bulk-typed-row").hidden = action !== "purge" || count === 0;
  $("#bulk-typed-label").textContent = `Purge deletes them for good. Type ${count} to confirm:`;
  const go = $("#bulk-go");
  go.textContent = count === 0 ? VERB[action] : `${VERB[action]} ${tasks(count)}`;
  go.className = action === "purge" || action === "abort" ? "danger" : "";
  const ready = () => {
    go.disabled = count === 0
      || (!$("#bulk-all-row").hidden && !all.checked)
      || (!$("#bulk-typed-row").hidden && typed.value.trim() !== String(count));
  };
  all.onchange = ready;
  typed.oninput = ready;
  ready();
  go.onclick = async (ev) => {
    ev.preventDefault();
    go.disabled = true;
    try {
      const op = await ctx.api("POST", "/v1/bulk", { action, filter });
      dialog.close("confirm");
      ctx.started(op);
    } catch (err) {
      $("#bulk-dialog-error").textContent = ctx.problemText(err);  // the dialog stays: nothing lost
      ready();
    }
  };
  dialog.showModal();
}

// --- the operations view --------------------------------------------------------

function progress(op) {
  const touched = op.done + op.skipped + op.failed;
  return h("div", { class: "bulk-progress" },
    h("progress", { max: String(Math.max(op.total, 1)), value: String(op.total ? touched : op.status === "done" ? 1 : 0) }),
    h("span", { class: "bulk-numbers" },
      h("span", { "data-field": "done" }, `${op.done} done`), " · ",
      h("span", { "data-field": "skipped" }, `${op.skipped} skipped`), " · ",
      h("span", { "data-field": "failed" }, `${op.failed} failed`), " of ",
      h("span", { "data-field": "total" }, String(op.total))));
}

function shownFilter(filter) {
  const given = Object.fromEntries(Object.entries(filter).filter(([, v]) => v != null)
    .map(([k, v]) => [k, k === "metadata" ? Object.entries(v).map(([a, b]) => `${a}:${b}`) : v]));
  return filterWords(given) ?? "every task";
}

// The operations, newest first; returns whether one is still running.
export function showOperations(body, list) {
  const items = body.operations.map((op) => h("li", { class: "bulk-op", "data-id": op.id, "data-status": op.status },
    h("div", { class: "row" },
      h("span", { class: "bulk-action-name" }, VERB[op.action] || op.action),
      h("span", { class: `badge status-${op.status === "done" ? "completed" : op.status}`, "data-field": "status" }, op.status),
      h("a", { class: "bulk-task", href: `#task=${enc(op.id)}` }, "its task")),
    progress(op),
    h("div", { class: "meta bulk-filter" }, shownFilter(op.filter), " · ", new Date(op.created_at).toLocaleString()),
    op.error ? h("div", { class: "error-text" }, op.error) : null,
    op.errors.length ? h("ul", { class: "bulk-errors" }, ...op.errors.map((e) => h("li", {}, `${e.task_id}: ${e.error}`))) : null));
  list.replaceChildren(...items);
  if (!items.length) list.append(h("li", { class: "empty" }, "No bulk operations yet."));
  return body.operations.some((op) => op.status === "running");
}
