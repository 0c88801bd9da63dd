// Server-sent events over fetch(): EventSource cannot send an Authorization
// header, and a token must never travel in a URL (URLs end up in logs).

export class HttpError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// Read one SSE response. Calls onEvent({id, event, data}) per event (data is
// parsed JSON). Resolves "end" when the server sent its `end` event, or
// "closed" when the connection closed without one (the caller reconnects).
export async function readEvents(url, { token, lastEventId, signal, onEvent, onOpen }) {
  const headers = { Accept: "text/event-stream", Authorization: `Bearer ${token}` };
  if (lastEventId != null) headers["Last-Event-ID"] = String(lastEventId);
  const res = await fetch(url, { headers, signal, cache: "no-store" });
  if (!res.ok) {
    let problem = null;
    try { problem = await res.json(); } catch { /* not JSON */ }
    throw new HttpError(res.status, problem);
  }
  if (onOpen) onOpen();
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let fields = { id: null, event: "message", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return "closed";
    buffer += value;
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop();  // a partial line waits for the next chunk
    for (const line of lines) {
      if (line === "") {
        if (fields.data.length) {
          const ev = { id: fields.id, event: fields.event, data: JSON.parse(fields.data.join("\n")) };
          if (ev.event === "end") { reader.cancel().catch(() => {}); return "end"; }
          onEvent(ev);
        }
        fields = { id: null, event: "message", data: [] };
      } else if (line.startsWith(":")) {
        // keep-alive comment
      } else {
        const i = line.indexOf(":");
        const name = i < 0 ? line : line.slice(0, i);
        let val = i < 0 ? "" : line.slice(i + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (name === "data") fields.data.push(val);
        else if (name === "id") fields.id = Number(val);
        else if (name === "event") fields.event = val;
      }
    }
  }
}

// Follow a task's events until its stream ends, reconnecting after network
// errors from the last seq received. Returns a function that stops following.
export function follow(url, { token, afterSeq, onEvent, onState, onFatal }) {
  const controller = new AbortController();
  let last = afterSeq;
  (async () => {
    let delay = 500;
    while (!controller.signal.aborted) {
      try {
        const how = await readEvents(url, {
          token,
          lastEventId: last,
          signal: controller.signal,
          onOpen: () => { delay = 500; onState("live"); },
          onEvent: (ev) => { last = ev.id; onEvent(ev); },
        });
        if (how === "end") { onState("ended"); return; }
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof HttpError && err.status < 500) { onFatal(err); return; }
      }
      onState("reconnecting");
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();
  return () => controller.abort();
}
