/**
 * The official TypeScript client of `duragent serve` (docs/http-api.md), for Node 20+
 * and browsers. Its types are generated from the committed OpenAPI document
 * (clients/openapi.json -> src/schema.ts, by scripts/client-schema); it needs only
 * `fetch`. Every problem answer is thrown as a `DuragentError` with its `type`.
 */
import type { components, operations } from "./schema.js";

type Schemas = components["schemas"];
export type TaskOut = Schemas["TaskOut"];
export type TaskSummary = Schemas["TaskSummary"];
export type TaskPageOut = Schemas["TaskPageOut"];
export type TaskWaitOut = Schemas["TaskWaitOut"];
export type TaskStatus = Schemas["TaskStatus"];
export type Entry = Schemas["Entry"];
export type StreamEnd = Schemas["StreamEnd"];
/** One event of a task's stream: a committed entry, or the final `end` (by `kind`). */
export type TaskStreamEvent = Schemas["TaskStreamEvent"];
export type StreamTokenOut = Schemas["StreamTokenOut"];
export type Problem = Schemas["Problem"];
export type TaskCreate = Schemas["TaskCreate"];
export type RespondRequest = Schemas["RespondRequest"];
export type MessageRequest = Schemas["MessageRequest"];
export type ForkRequest = Schemas["ForkRequest"];
export type RetryRequest = Schemas["RetryRequest"];
export type MigrateRequest = Schemas["MigrateRequest"];
export type PauseRequest = Schemas["PauseRequest"];
export type AbortRequest = Schemas["AbortRequest"];
export type ListTasksQuery = NonNullable<operations["listTasks"]["parameters"]["query"]>;
export type WaitQuery = NonNullable<operations["waitTask"]["parameters"]["query"]>;
export type { components, operations, paths } from "./schema.js";

/** A problem answer (RFC 9457): compare `type` (e.g. "/problems/task-not-found"). */
export class DuragentError extends Error {
  readonly status: number;
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  readonly problem: Record<string, unknown>;

  constructor(status: number, problem: Record<string, unknown>) {
    const type = typeof problem.type === "string" ? problem.type : "about:blank";
    const title = typeof problem.title === "string" ? problem.title : "";
    const detail =
      typeof problem.detail === "string" ? problem.detail : title || `HTTP ${status}`;
    super(`${detail} (${status} ${type})`);
    this.name = "DuragentError";
    this.status = status;
    this.type = type;
    this.title = title;
    this.detail = detail;
    this.problem = problem;
  }

  /** 404: no such task (or not the caller's), session, queue or schedule. */
  get notFound(): boolean {
    return this.status === 404;
  }
}

/** No answer from the server (a network failure), after the stream's reconnects. */
export class ServerUnreachable extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ServerUnreachable";
  }
}

export interface ClientOptions {
  /** The server, e.g. "http://127.0.0.1:8000"; in a browser, "" for the page's own. */
  baseUrl: string;
  /** The bearer token; leave it out in a page that streams with stream tokens only. */
  token?: string;
  /** A fetch of your own (default: the global one). */
  fetch?: typeof fetch;
}

export interface StreamOptions {
  /** Start after this seq (default 0: from the first entry). */
  after?: number;
  /**
   * Open the stream with a stream token instead of the bearer token (a browser
   * that holds none): called before each connection, since a token expires after
   * 60 s, e.g. `() => myBackend.streamTokenFor(taskId)` (POST /stream-token there).
   */
  streamToken?: () => Promise<string> | string;
  /** Stops the stream (the iteration then ends with an AbortError). */
  signal?: AbortSignal;
  /** Failed connections in a row before giving up (default 5). */
  reconnects?: number;
}

const MAX_WAIT = 300; // the server's longest /wait, in seconds

export class DuragentClient {
  private readonly baseUrl: string;
  private readonly token: string | undefined;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.fetchImpl = options.fetch ?? ((input, init) => fetch(input, init));
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return this.token ? { Authorization: `Bearer ${this.token}`, ...extra } : extra;
  }

  private async call<T>(
    method: string,
    path: string,
    body?: unknown,
    query?: URLSearchParams,
  ): Promise<T> {
    const url = `${this.baseUrl}${path}${query && query.size ? `?${query}` : ""}`;
    const init: RequestInit = { method, headers: this.headers() };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = this.headers({ "Content-Type": "application/json" });
    }
    let r: Response;
    try {
      r = await this.fetchImpl(url, init);
    } catch (cause) {
      throw new ServerUnreachable(`${method} ${path}: ${String(cause)}`, { cause });
    }
    if (!r.ok) throw await problem(r);
    return (await r.json()) as T;
  }

  /** Start a task (POST /v1/tasks); a used request_id gives back its task. */
  submit(body: TaskCreate): Promise<TaskOut> {
    return this.call("POST", "/v1/tasks", body);
  }

  get(taskId: string): Promise<TaskOut> {
    return this.call("GET", task(taskId));
  }

  /** One page of the caller's tasks; pass `next_cursor` as `cursor` for the next. */
  list(query: ListTasksQuery = {}): Promise<TaskPageOut> {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value === undefined || value === null) continue;
      for (const one of Array.isArray(value) ? value : [value]) params.append(key, String(one));
    }
    return this.call("GET", "/v1/tasks", undefined, params);
  }

  /** Every task `list(query)` finds, page after page. */
  async *tasks(query: ListTasksQuery = {}): AsyncGenerator<TaskSummary> {
    let cursor = query.cursor ?? null;
    do {
      const page = await this.list({ ...query, cursor });
      yield* page.tasks;
      cursor = page.next_cursor;
    } while (cursor);
  }

  /**
   * The task once it is finished (`until: "input"`: or waits for a person, is paused
   * or blocked), or after `timeout` seconds (default: no limit) with `timed_out`.
   * Long-polls GET /wait, up to 300 s a call.
   */
  async wait(
    taskId: string,
    options: { until?: WaitQuery["until"]; timeout?: number } = {},
  ): Promise<TaskWaitOut> {
    const end = options.timeout === undefined ? undefined : Date.now() + options.timeout * 1000;
    for (;;) {
      const left = end === undefined ? MAX_WAIT : Math.max((end - Date.now()) / 1000, 0.001);
      const params = new URLSearchParams({
        until: options.until ?? "finished",
        timeout: String(Math.min(MAX_WAIT, Math.round(left * 1000) / 1000)),
      });
      const got = await this.call<TaskWaitOut>("GET", `${task(taskId)}/wait`, undefined, params);
      if (!got.timed_out || (end !== undefined && Date.now() >= end)) return got;
    }
  }

  /** A short-lived token that opens this task's event stream only (for a browser). */
  streamToken(taskId: string): Promise<StreamTokenOut> {
    return this.call("POST", `${task(taskId)}/stream-token`);
  }

  /**
   * The task's committed entries, live, then its `end` event, where the iteration
   * ends. A dropped connection is opened again with Last-Event-ID (and a fresh stream
   * token, if streaming with those), so no entry is missed or repeated.
   */
  async *stream(taskId: string, options: StreamOptions = {}): AsyncGenerator<TaskStreamEvent> {
    let last = options.after ?? 0;
    let failures = 0;
    const most = options.reconnects ?? 5;
    for (;;) {
      let received = false;
      try {
        for await (const event of this.streamOnce(taskId, last, options)) {
          received = true;
          failures = 0;
          yield event;
          if (event.kind === "end") return;
          last = event.seq;
        }
        throw new ServerUnreachable("the stream ended before its end event");
      } catch (error) {
        if (error instanceof DuragentError || options.signal?.aborted) throw error;
        failures = received ? 0 : failures + 1;
        if (failures >= most) {
          throw new ServerUnreachable(`the event stream of ${taskId}: ${String(error)}`, {
            cause: error,
          });
        }
        if (!received) await sleep(Math.min(100 * 2 ** failures, 1000));
      }
    }
  }

  private async *streamOnce(
    taskId: string,
    after: number,
    options: StreamOptions,
  ): AsyncGenerator<TaskStreamEvent> {
    let url = `${this.baseUrl}${task(taskId)}/events`;
    let headers = this.headers({ Accept: "text/event-stream", "Last-Event-ID": String(after) });
    if (options.streamToken) {
      // The token goes in the query, and only to this route; no bearer token is sent.
      url += `?stream_token=${encodeURIComponent(await options.streamToken())}`;
      headers = { Accept: "text/event-stream", "Last-Event-ID": String(after) };
    }
    const r = await this.fetchImpl(url, { headers, signal: options.signal });
    if (!r.ok) throw await problem(r);
    if (!r.body) throw new ServerUnreachable("the stream has no body");
    for await (const sse of sseEvents(r.body)) {
      yield JSON.parse(sse.data) as TaskStreamEvent;
      if (sse.event === "end") return;
    }
  }

  /** Approve (with edited `arguments`) or deny an approval, answer a question, or `decisions`. */
  respond(taskId: string, body: RespondRequest): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/respond`, body);
  }

  /** A user message into a live task; the same request_id and text sends nothing again. */
  send(taskId: string, body: MessageRequest): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/messages`, body);
  }

  /** A new task from the end of round `at_round` of this one. */
  fork(taskId: string, body: ForkRequest): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/fork`, body);
  }

  /** Continue a failed task from its last commit. */
  retry(taskId: string, body: RetryRequest = {}): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/retry`, body);
  }

  /** Move the task to another version of its agent (recorded; a running task is
   * handed back at its next safe point). */
  migrate(taskId: string, body: MigrateRequest): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/migrate`, body);
  }

  pause(taskId: string, body: PauseRequest = {}): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/pause`, body);
  }

  resume(taskId: string): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/resume`);
  }

  abort(taskId: string, body: AbortRequest = {}): Promise<TaskOut> {
    return this.call("POST", `${task(taskId)}/abort`, body);
  }
}

function task(taskId: string): string {
  if (!taskId || taskId === "." || taskId === "..") throw new TypeError(`not a task id: ${taskId}`);
  return `/v1/tasks/${encodeURIComponent(taskId)}`;
}

async function problem(r: Response): Promise<DuragentError> {
  const text = await r.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  const doc =
    typeof body === "object" && body !== null
      ? (body as Record<string, unknown>)
      : { detail: text.slice(0, 500) };
  return new DuragentError(r.status, doc);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export interface SseEvent {
  event: string;
  data: string;
  id: string | undefined;
}

/** Server-sent events read from a fetch body (no EventSource needed). */
export async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id: string | undefined;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
        if (line === "") {
          if (data.length) yield { event: event || "message", data: data.join("\n"), id };
          event = "";
          data = [];
          id = undefined;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        const field = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (name === "event") event = field;
        else if (name === "data") data.push(field);
        else if (name === "id") id = field;
      }
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}
