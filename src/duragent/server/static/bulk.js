// Bulk actions on the filtered list (POST /v1/bulk) and the "Bulk" view of the
// operations (GET /v1/bulk). An action first asks the server for a dry run with
// the list's filter, then asks for a confirmation that names the count and the
// filter; only a confirmed action starts an operation. Purge needs the count
// typed back; a filter with no criteria needs "all my tasks" ticked. Migrate asks
// for the version in the dialog, and counts once a valid one is typed. Every text
// (filters, errors, ids) is set as text, never as markup.

import { badMeta } from "./filters.js";
import { h } from "./timeline.js";

export const BULK_ACTIONS = ["retry", "pause", "resume", "abort", "migrate", "purge"];
const VERB = { retry: "Retry", pause: "Pause", resume: "Resume", abort: "Abort", migrate: "Migrate", purge: "Purge" };
const CHOICE = { migrate: "Migrate to version…" };  // the list's words, where not the verb
// An agent version, as the server checks it (runtime/_fingerprint.py VERSION_PATTERN).
const VERSION = /^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$/;
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
    h("option", { value: "" }, "Bulk action…"), ...BULK_ACTIONS.map((a) => h("option", { value: a }, CHOICE[a] ?? VERB[a])));
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
  const words = filterWords(listFilter);
  const dialog = $("#bulk-dialog"), go = $("#bulk-go"), all = $("#bulk-all"), typed = $("#bulk-typed");
  const version = $("#bulk-version"), problem = $("#bulk-dialog-error");
  const migrate = action === "migrate";
  const target = () => version.value.trim();
  const body = (extra) => ({ action, filter, ...(migrate ? { to_version: target() } : {}), ...extra });
  let count = null;  // not counted yet (migrate: no valid version typed yet)
  const ready = () => {
    go.disabled = !count
      || (!$("#bulk-all-row").hidden && !all.checked)
      || (!$("#bulk-typed-row").hidden && typed.value.trim() !== String(count));
  };
  const show = () => {
    const matching = `matching: ${words ?? "all my tasks"}`;
    const to = migrate ? ` to version ${target()}` : "";
    dialog.dataset.count = count === null ? "" : String(count);
    $("#bulk-question").textContent = count === null ? `Migrate the tasks ${matching} to which version?`
      : count === 0 ? `No tasks to ${action} match: ${words ?? "all my tasks"}.`
        : `${VERB[action]} ${tasks(count)} ${matching}${to}?`;
    // No criteria: every task of mine; say so and make it ticked on purpose.
    $("#bulk-all-row").hidden = words !== null || !count;
    // Purge deletes for good: the count typed back.
    $("#bulk-typed-row").hidden = action !== "purge" || !count;
    $("#bulk-typed-label").textContent = `Purge deletes them for good. Type ${count} to confirm:`;
    go.textContent = !count ? VERB[action] : `${VERB[action]} ${tasks(count)}`;
    ready();
  };
  let asked = 0;
  const countNow = async () => {
    const mine = ++asked;
    count = null;
    show();
    if (migrate && !VERSION.test(target())) {
      if (target()) problem.textContent = "a version is 1-64 letters, digits, '.', '_', '+' or '-'";
      return;
    }
    const { count: n } = await ctx.api("POST", "/v1/bulk", body({ dry_run: true }));
    if (mine === asked) { count = n; show(); }
  };
  dialog.dataset.action = action;
  problem.textContent = "";
  all.checked = false;
  typed.value = "";
  version.value = "";
  $("#bulk-version-row").hidden = !migrate;
  version.oninput = () => {
    problem.textContent = "";
    countNow().catch((err) => { problem.textContent = ctx.problemText(err); });
  };
  all.onchange = ready;
  typed.oninput = ready;
  go.className = action === "purge" || action === "abort" ? "danger" : "";
  if (!migrate) await countNow();  // an error here is shown by the action list
  else show();
  go.onclick = async (ev) => {
    ev.preventDefault();
    go.disabled = true;
    try {
      const op = await ctx.api("POST", "/v1/bulk", body({}));
      dialog.close("confirm");
      ctx.started(op);
    } catch (err) {
      problem.textContent = ctx.problemText(err);  // the dialog stays: nothing lost
      ready();
    }
  };
  dialog.showModal();
  if (migrate) version.focus();
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
      h("span", { class: "bulk-action-name" }, (VERB[op.action] || op.action) + (op.to_version ? ` to ${op.to_version}` : "")),
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
