// The task list's filters as one object with the REST filter names of GET /v1/tasks
// (and of POST /v1/bulk's `filter`): status, agent, version, queue, meta, created_after,
// created_before, updated_after, updated_before, and id_prefix (the search box:
// task ids starting with it; GET /v1/tasks only). A name is present only when set;
// status and meta are lists (the REST repeats them), times are ISO 8601 in UTC.
// The filters live in the page's URL (#status=failed&agent=…&task=…), so a link
// shares them, and a reload keeps them.

export const FILTER_NAMES = [
  "status", "agent", "version", "queue", "meta",
  "created_after", "created_before", "updated_after", "updated_before", "id_prefix",
];
export const TIME_NAMES = FILTER_NAMES.filter((n) => n.endsWith("_after") || n.endsWith("_before"));
const LISTS = new Set(["status", "meta"]);

const field = (name) => document.getElementById(`filter-${name}`);

// "a:1, b:2" -> ["a:1", "b:2"]; a pair needs a key and a colon. A comma starts a
// new pair only where a key and its colon follow: "tags:a,b" is one pair (the
// value a,b), as a link's meta=tags:a,b says.
export function parseMeta(text) {
  return text.split(/,(?=[^,:]*:)/).map((p) => p.trim()).filter(Boolean);
}

export function badMeta(pairs) {
  return pairs.find((p) => !/^[^:]+:/.test(p)) ?? null;
}

// A datetime-local value (the browser's zone) -> ISO in UTC, and back.
function toIso(local) {
  const d = new Date(local);
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

const FULL_ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d{1,6})?)?(Z|[+-]\d\d:\d\d)$/;

function toLocal(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

// The filter the form shows, as the REST names it.
export function currentFilter() {
  const out = {};
  const status = field("status").value;
  if (status) out.status = [status];
  for (const name of ["agent", "version", "queue", "id_prefix"]) {
    const v = field(name).value.trim();
    if (v) out[name] = v;
  }
  const meta = parseMeta(field("meta").value);
  if (meta.length) out.meta = meta;
  for (const name of TIME_NAMES) {
    const el = field(name);
    // The URL's time as it was, unless the field (minutes only) was changed since.
    const iso = !el.value ? null : el.value === el.dataset.shown ? el.dataset.iso : toIso(el.value);
    if (iso) out[name] = iso;
  }
  return out;
}

// The filter as query parameters (GET /v1/tasks, /v1/counts take the same names).
export function filterQuery(filter) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(filter)) {
    for (const v of LISTS.has(name) ? value : [value]) q.append(name, v);
  }
  return q;
}

// The URL's filters into the form (an agent the list does not offer is added to it).
export function showFilter(params) {
  field("status").value = params.get("status") || "";
  const agent = params.get("agent") || "";
  const select = field("agent");
  if (agent && ![...select.options].some((o) => o.value === agent)) {
    select.append(new Option(agent, agent));
  }
  select.value = agent;
  field("version").value = params.get("version") || "";
  field("queue").value = params.get("queue") || "";
  field("id_prefix").value = params.get("id_prefix") || "";
  field("meta").value = params.getAll("meta").join(", ");
  for (const name of TIME_NAMES) {
    const el = field(name), iso = params.get(name);
    el.value = iso ? toLocal(iso) : "";
    el.dataset.shown = el.value;  // a time to the millisecond shown to the minute:
    el.dataset.iso = el.value ? (FULL_ISO.test(iso) ? iso : toIso(iso)) : "";  // the filter keeps it
  }
}

// The page's hash: the filter, then the open task and the view, if any.
export function hashFor(filter, extra) {
  const q = filterQuery(filter);
  for (const [k, v] of Object.entries(extra)) if (v) q.set(k, v);
  const text = q.toString();
  return text ? `#${text}` : "#";
}

export function hashParams() {
  return new URLSearchParams(location.hash.slice(1));
}

// "3 filters: status failed · agent quick" (textContent only).
export function describeFilter(filter) {
  const parts = Object.entries(filter).map(([k, v]) => `${k.replace("_", " ")} ${Array.isArray(v) ? v.join(", ") : v}`);
  return parts.length ? `Filtered: ${parts.join(" · ")}` : "All my tasks";
}
