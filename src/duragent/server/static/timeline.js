// A task's conversation, built from its committed entries in seq order.
// The same rules as duragent.runtime.views.ui_view: streamed text is shown
// until the round's assistant message arrives (or a progress rollback voids
// it); tool cards follow intent -> wait -> decision -> result (a decision may
// carry edited arguments: the card then shows those, and the model's). An API rollback
// marks what it voids (the model no longer sees it) but removes nothing.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const STATE_LABEL = {
  intent: "queued",
  running: "running…",
  waiting: "waiting",
  approved: "approved",
  ok: "done",
  error: "error",
  denied: "denied",
  interrupted: "interrupted",
  rolled_back: "rolled back",
};

function prettyArgs(text) {
  try { return JSON.stringify(JSON.parse(text || "{}"), null, 1).replace(/\n\s*/g, " "); }
  catch { return text; }
}

export class Timeline {
  // actions: { respond(callId, body) -> Promise } used by approval and answer forms
  constructor(container, actions) {
    this.container = container;
    this.actions = actions;
    this.lastSeq = 0;
    this.streaming = new Map();  // round -> item
    this.answered = new Set();   // rounds whose assistant message is committed
    this.cards = new Map();      // call_id -> item
    this.items = [];             // every item shown, for rollbacks to mark
    this.container.replaceChildren();
  }

  add(item) {
    this.items.push(item);
    item.el = this.render(item);
    this.container.append(item.el);
    return item;
  }

  update(item) {
    const el = this.render(item);
    item.el.replaceWith(el);
    item.el = el;
  }

  remove(item) {
    if (item && item.el) item.el.remove();
  }

  apply(e) {
    if (e.seq <= this.lastSeq) return;  // never twice
    this.lastSeq = e.seq;
    const p = e.payload;
    switch (e.kind) {
      case "api_message": return this.message(e, p);
      case "progress": return this.progress(e, p);
      case "rollback":
        if (p.scope === "progress") {
          this.remove(this.streaming.get(e.round));
          this.streaming.delete(e.round);
        } else if ((p.scope || "api") === "api") this.voidRange(p.from_seq, p.to_seq);
        return;
      case "tool_intent": {
        const card = this.cards.get(p.call_id);
        if (card) { card.replay = p.replay; if (card.state === "intent") card.state = "running"; this.update(card); }
        return;
      }
      case "checkpoint": return this.checkpoint(p);
      case "tool_result": {
        const card = this.cards.get(p.tool_call_id);
        if (card) {
          card.state = p.outcome || "ok"; card.result = p.content; card.resultSeq = e.seq;
          card.resultVoided = false; card.wait = null; this.update(card);
        }
        return;
      }
      case "handoff":
        // The model took a transfer tool: from here on, another agent runs the task.
        this.add({ type: "handoff", from: p.from, to: p.to, seq: e.seq });
        return;
      case "compaction":
        // The model sees this summary instead of those rounds; they stay above, whole.
        if (p.summary) this.add({ type: "compaction", from: p.from_round, to: p.to_round, text: p.summary });
        return;
      case "ui_message":
        if ("from_seq" in p) return;
        if (p.type === "notice") this.add({ type: "notice", text: p.message });
        else if (p.type === "error") this.add({ type: "error", text: p.message, detail: p.detail });
        else if (p.type === "text") this.add({ type: "bubble", role: p.role, text: p.text });
        return;
      default:
        return;
    }
  }

  message(e, p) {
    if (p.role === "user") {
      this.add({ type: "bubble", role: "user", text: p.content, seq: e.seq });
    } else if (p.role === "assistant") {
      this.answered.add(e.round);
      this.remove(this.streaming.get(e.round));
      this.streaming.delete(e.round);
      if (p.content) this.add({ type: "bubble", role: "assistant", text: p.content, seq: e.seq });
      for (const call of p.tool_calls || []) {
        const card = this.add({
          type: "tool", callId: call.id, name: call.function.name,
          args: prettyArgs(call.function.arguments), state: "intent", partial: "", events: [], seq: e.seq,
        });
        this.cards.set(call.id, card);
      }
    }
  }

  voidRange(from, to) {
    const inside = (seq) => seq != null && seq >= from && seq <= to;
    for (const item of this.items) {
      let changed = false;
      if (!item.voided && inside(item.seq)) { item.voided = true; changed = true; }
      // A kept call whose result alone is voided gets a new ("rolled back") result next.
      if (item.type === "tool" && !item.voided && inside(item.resultSeq)) { item.resultVoided = true; changed = true; }
      if (changed) this.update(item);
    }
  }

  progress(e, p) {
    if ("event" in p) {  // a custom event a tool emitted (ctx.emit): shown as name and JSON
      const card = this.cards.get(p.call_id);
      if (card) { card.events.push({ name: p.event, data: p.data }); this.update(card); }
      return;
    }
    if ("call_id" in p) {
      const card = this.cards.get(p.call_id);
      if (card) { card.partial += p.text || ""; this.update(card); }
      return;
    }
    if (this.answered.has(e.round)) return;
    let item = this.streaming.get(e.round);
    if (!item) {
      item = this.add({ type: "bubble", role: "assistant", text: "", streaming: true });
      this.streaming.set(e.round, item);
    }
    item.text += p.text || "";
    item.el.querySelector(".text").textContent = item.text;
  }

  checkpoint(p) {
    const card = this.cards.get(p.call_id);
    if (!card) return;
    if (p.type === "wait") { card.state = "waiting"; card.wait = p; }
    else if (p.type === "decision") {
      card.wait = null;
      card.state = p.approved ? "approved" : "denied";
      card.decision = p;
      if (p.arguments) {  // a person edited the arguments: the call runs with these
        card.originalArgs = card.args;
        card.args = prettyArgs(JSON.stringify(p.arguments));
      }
    } else if (p.type === "started") card.state = "running";
    this.update(card);
  }

  // --- rendering ---

  render(item) {
    if (item.type === "bubble") {
      return h("div", { class: `bubble ${item.role}${item.streaming ? " streaming" : ""}${item.voided ? " voided" : ""}`,
                        "data-role": item.role, "data-voided": item.voided || null },
        h("div", { class: "who" }, item.role === "user" ? "You" : "Assistant",
          item.voided ? h("span", { class: "voided-label", title: "Rolled back: the model no longer sees this" }, " · rolled back") : null),
        h("div", { class: "text" }, item.text));
    }
    if (item.type === "notice") return h("div", { class: "notice" }, item.text);
    if (item.type === "handoff") {
      return h("div", { class: `handoff${item.voided ? " voided" : ""}`, "data-from": item.from, "data-to": item.to,
                        "data-voided": item.voided || null },
        "Handoff: ", h("span", { class: "handoff-from" }, item.from), " → ",
        h("span", { class: "handoff-to" }, item.to),
        item.voided ? h("span", { class: "voided-label", title: "Rolled back: not in force" }, " · rolled back") : null);
    }
    if (item.type === "compaction") {
      return h("details", { class: "compaction", "data-rounds": `${item.from}-${item.to}` },
        h("summary", {}, `Rounds ${item.from}–${item.to} summarised: what the model sees instead`),
        h("div", { class: "text" }, item.text));
    }
    if (item.type === "error") {
      return h("div", { class: "error-item" }, h("strong", {}, item.text), item.detail ? h("div", {}, item.detail) : null);
    }
    return this.renderCard(item);
  }

  renderCard(card) {
    const el = h("div", { class: `tool-card state-${card.state}${card.voided ? " voided" : ""}`, "data-call-id": card.callId,
                          "data-state": card.state, "data-voided": card.voided || null },
      h("div", { class: "tool-head" },
        h("span", { class: "tool-icon" }, "⚙"),
        h("span", { class: "tool-name" }, card.name),
        card.voided ? h("span", { class: "voided-label", title: "Rolled back: the model no longer sees this call" }, "rolled back") : null,
        card.replay ? h("span", { class: "replay", title: "replay policy" }, `replay: ${card.replay}`) : null,
        h("span", { class: `tool-state badge-${card.state}` }, STATE_LABEL[card.state] || card.state)),
      h("code", { class: "tool-args" }, card.args),
      card.originalArgs != null
        ? h("div", { class: "tool-edited", title: "A person edited the arguments before approving" },
            "edited before approval; the model asked for ", h("code", { class: "tool-args-original" }, card.originalArgs))
        : null);
    if (card.events && card.events.length) {
      el.append(h("div", { class: "tool-events" }, ...card.events.map((ev) =>
        h("div", { class: "tool-event", "data-event": ev.name },
          h("span", { class: "event-name" }, ev.name), " ",
          h("code", { class: "event-data" }, JSON.stringify(ev.data))))));
    }
    if (card.partial && card.result == null) el.append(h("div", { class: "tool-partial" }, card.partial));
    if (card.result != null) el.append(h("pre", { class: `tool-result${card.resultVoided ? " voided" : ""}` }, card.result));
    if (card.state === "waiting" && card.wait) el.append(this.waitForm(card));
    return el;
  }

  waitForm(card) {
    const w = card.wait;
    if (w.wait === "approval") {
      const reason = h("input", { type: "text", class: "reason", placeholder: "Reason (optional)" });
      const original = w.arguments ?? (() => { try { return JSON.parse(card.args); } catch { return {}; } })();
      const editor = h("textarea", { class: "edit-args", rows: 4, spellcheck: "false", hidden: true });
      editor.value = JSON.stringify(original, null, 2);
      const problem = h("div", { class: "edit-problem", role: "alert" });
      const go = (approve) => async (ev) => {
        const body = { approve, reason: reason.value || null };
        if (approve && !editor.hidden) {
          let edited;
          try { edited = JSON.parse(editor.value); } catch (err) { edited = err; }
          if (edited === null || typeof edited !== "object" || Array.isArray(edited) || edited instanceof Error) {
            problem.textContent = "The arguments must be a JSON object.";
            return;
          }
          body.arguments = edited;
        }
        problem.textContent = "";
        ev.target.disabled = true;
        const ok = await this.actions.respond(card.callId, body);
        if (!ok) ev.target.disabled = false;
      };
      const approve = h("button", { class: "approve", onclick: go(true) }, "Approve");
      const edit = h("button", { class: "secondary edit", onclick: () => {
        editor.hidden = !editor.hidden;
        approve.textContent = editor.hidden ? "Approve" : "Approve with these arguments";
        edit.textContent = editor.hidden ? "Edit arguments" : "Cancel edit";
        if (!editor.hidden) editor.focus();
      } }, "Edit arguments");
      const expires = w.expires_at
        ? h("div", { class: "expires" }, `Denied automatically at ${new Date(w.expires_at).toLocaleString()} without a decision.`)
        : null;
      return h("div", { class: "wait approval" },
        h("div", { class: "question" }, w.question || "Allow this call?"),
        expires, editor, problem,
        h("div", { class: "row" }, reason, w.editable === false ? null : edit, approve,
          h("button", { class: "deny danger", onclick: go(false) }, "Deny")));
    }
    if (w.wait === "input") {
      const answer = h("input", { type: "text", class: "answer", placeholder: "Your answer" });
      const send = async (ev) => {
        ev.preventDefault();
        if (!answer.value.trim()) return;
        const ok = await this.actions.respond(card.callId, { answer: answer.value });
        if (!ok) answer.focus();
      };
      return h("form", { class: "wait input", onsubmit: send },
        h("div", { class: "question" }, w.question),
        h("div", { class: "row" }, answer, h("button", { type: "submit" }, "Send answer")));
    }
    if (w.wait === "timer") return h("div", { class: "wait" }, `Sleeping until ${new Date(w.wake_at).toLocaleString()}`);
    if (w.wait === "subtask") return h("div", { class: "wait" }, `Waiting for sub-task ${w.child_id}`);
    return h("div", { class: "wait" }, `Waiting (${w.wait})`);
  }
}
