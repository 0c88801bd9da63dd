// The TypeScript client against a live `duragent serve`, started by
// tests/test_client_typescript.py, which passes its address and tokens in the
// environment and builds this file with tsc: each flow the Python client's test has.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { DuragentClient, DuragentError, type TaskStreamEvent } from "../src/index.js";

function env(name: string): string {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run tests/test_client_typescript.py`);
  return value;
}

const baseUrl = env("DURAGENT_URL");
const alice = new DuragentClient({ baseUrl, token: env("DURAGENT_TOKEN") });
const bob = new DuragentClient({ baseUrl, token: env("DURAGENT_OTHER_TOKEN") });
const gates = env("DURAGENT_TEST_GATES");

function gate(): string {
  return `gate-${randomUUID().slice(0, 8)}`;
}

function open(name: string): void {
  writeFileSync(join(gates, name), "");
}

async function rejects(call: Promise<unknown>, status: number, type: string): Promise<DuragentError> {
  const error = await call.then(
    () => assert.fail(`expected a ${status} ${type}`),
    (e: unknown) => e,
  );
  assert.ok(error instanceof DuragentError, String(error));
  assert.equal(error.status, status);
  assert.equal(error.type, type);
  return error;
}

/** A fetch whose first event stream breaks right after its first event. */
function breakingFetch(): { fetch: typeof fetch; streams: number } {
  const state = { streams: 0, fetch: fetch };
  state.fetch = async (input, init) => {
    const r = await fetch(input, init);
    if (!String(input).includes("/events") || state.streams++ > 0 || !r.body) return r;
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        const before = text.length;
        const chunk = decoder.decode(value, { stream: true });
        text += chunk;
        const first = text.indexOf("id: ");
        const end = first < 0 ? -1 : text.indexOf("\n\n", first);
        if (end < 0) return controller.enqueue(new TextEncoder().encode(chunk));
        controller.enqueue(new TextEncoder().encode(text.slice(before, end + 2)));
        await reader.cancel();
        controller.error(new TypeError("terminated: the connection was cut"));
      },
    });
    return new Response(body, { status: r.status, headers: r.headers });
  };
  return state;
}

test("a stream cut after its first event reconnects and loses or repeats no event", async () => {
  const name = gate();
  const breaking = breakingFetch();
  const client = new DuragentClient({ baseUrl, token: env("DURAGENT_TOKEN"), fetch: breaking.fetch });
  const task = await client.submit({ agent: "holder", input: name });
  const events: TaskStreamEvent[] = [];
  for await (const event of client.stream(task.id)) {
    events.push(event);
    if (events.length === 1) open(name); // the rest comes only after the cut
  }
  assert.equal(breaking.streams, 2);
  const done = await client.get(task.id);
  const end = events.at(-1);
  assert.ok(end && end.kind === "end");
  assert.equal(end.status, "completed");
  const seqs = events.flatMap((e) => (e.kind === "end" ? [] : [e.seq]));
  assert.deepEqual(seqs, Array.from({ length: done.last_seq }, (_, i) => i + 1));
});

test("wait returns the finished task, or the task as it is after the timeout", async () => {
  const quick = await alice.submit({ agent: "quick", input: "hi" });
  const done = await alice.wait(quick.id);
  assert.equal(done.status, "completed");
  assert.equal(done.output, "Hello from quick.");
  assert.equal(done.timed_out, false);
  const name = gate();
  const held = await alice.submit({ agent: "holder", input: name });
  const late = await alice.wait(held.id, { timeout: 0.3 });
  assert.equal(late.timed_out, true);
  open(name);
  assert.equal((await alice.wait(held.id, { timeout: 60 })).status, "completed");
});

test("an approval is granted with edited arguments", async () => {
  const task = await alice.submit({ agent: "approver", input: "mail bob" });
  const parked = await alice.wait(task.id, { until: "input", timeout: 60 });
  assert.equal(parked.status, "waiting");
  assert.equal(parked.waiting_for?.[0]?.tool, "send_email");
  await rejects(
    alice.respond(task.id, { approve: true, arguments: { to: 42 } }),
    422,
    "/problems/invalid-tool-arguments",
  );
  await alice.respond(task.id, {
    approve: true,
    arguments: { to: "carol@example.com", body: "edited" },
  });
  const done = await alice.wait(task.id, { timeout: 60 });
  assert.equal(done.output, "Email done.");
  const payloads: string[] = [];
  for await (const event of alice.stream(task.id)) {
    if (event.kind !== "end") payloads.push(JSON.stringify(event.payload));
  }
  assert.ok(payloads.some((p) => p.includes("sent to carol@example.com")));
});

test("a message with a request id is sent once", async () => {
  const name = gate();
  const task = await alice.submit({ agent: "holder", input: name });
  await alice.send(task.id, { text: "also this", request_id: "m-1" });
  await alice.send(task.id, { text: "also this", request_id: "m-1" });
  await rejects(
    alice.send(task.id, { text: "something else", request_id: "m-1" }),
    409,
    "/problems/request-id-reused",
  );
  open(name);
  assert.equal((await alice.wait(task.id, { timeout: 60 })).status, "completed");
  await rejects(alice.send(task.id, { text: "too late" }), 409, "/problems/task-finished");
});

test("another user's task is not found, streamed or not", async () => {
  const task = await alice.submit({ agent: "quick", input: "mine" });
  const error = await rejects(bob.get(task.id), 404, "/problems/task-not-found");
  assert.ok(error.notFound && error.detail.includes(task.id));
  await rejects(bob.wait(task.id, { timeout: 1 }), 404, "/problems/task-not-found");
  const stream = async () => {
    for await (const _ of bob.stream(task.id)) assert.fail("bob read alice's stream");
  };
  await rejects(stream(), 404, "/problems/task-not-found");
});

test("fork and retry", async () => {
  const first = await alice.submit({ agent: "quick", input: "to fork" });
  await alice.wait(first.id, { timeout: 60 });
  const fork = await alice.fork(first.id, { at_round: 1, request_id: "fork-1" });
  assert.notEqual(fork.id, first.id);
  assert.deepEqual(fork.forked_from, { task_id: first.id, round: 1 });
  assert.equal((await alice.wait(fork.id, { timeout: 60 })).status, "completed");
  const flaky = await alice.submit({ agent: "flaky", input: `fail ${randomUUID()}` });
  assert.equal((await alice.wait(flaky.id, { timeout: 60 })).status, "failed");
  await alice.retry(flaky.id);
  const again = await alice.wait(flaky.id, { timeout: 60 });
  assert.equal(again.status, "completed");
  assert.equal(again.output, "Done after a retry.");
});

test("pause, resume and abort", async () => {
  const task = await alice.submit({ agent: "slow", input: "tick" });
  await alice.pause(task.id);
  const paused = await alice.wait(task.id, { until: "input", timeout: 60 });
  assert.equal(paused.status, "paused");
  await alice.resume(task.id);
  await alice.abort(task.id, { reason: "enough" });
  assert.equal((await alice.wait(task.id, { timeout: 60 })).status, "aborted");
  await rejects(alice.resume(task.id), 409, "/problems/invalid-transition");
});

test("lists filter and page", async () => {
  const batch = randomUUID();
  const made: string[] = [];
  for (const i of [0, 1, 2]) {
    made.push((await alice.submit({ agent: "quick", input: `n${i}`, metadata: { batch } })).id);
  }
  const first = await alice.list({ meta: [`batch:${batch}`], limit: 2 });
  assert.equal(first.tasks.length, 2);
  assert.ok(first.next_cursor);
  const seen: string[] = [];
  for await (const t of alice.tasks({ meta: [`batch:${batch}`], limit: 1 })) seen.push(t.id);
  assert.deepEqual(seen.sort(), made.sort());
  const none = await alice.list({ meta: [`batch:${batch}`], agent: "slow", status: ["running"] });
  assert.deepEqual(none.tasks, []);
});

test("a page without the bearer token streams with stream tokens, in the query of /events only", async () => {
  const sent: { url: string; auth: string | null }[] = [];
  const page = new DuragentClient({
    baseUrl,
    fetch: async (input, init) => {
      sent.push({ url: String(input), auth: new Headers(init?.headers).get("Authorization") });
      return fetch(input, init);
    },
  });
  const task = await alice.submit({ agent: "streamer", input: "go" });
  const kinds: string[] = [];
  // The app's backend mints the token (here: alice's client); the page never holds hers.
  for await (const event of page.stream(task.id, {
    streamToken: async () => (await alice.streamToken(task.id)).token,
  })) {
    kinds.push(event.kind);
  }
  assert.equal(kinds.at(-1), "end");
  assert.ok(kinds.includes("progress"));
  assert.ok(sent.length >= 1);
  for (const request of sent) {
    assert.equal(request.auth, null);
    assert.match(request.url, /\/v1\/tasks\/[^/]+\/events\?stream_token=/);
  }
  await rejects(page.get(task.id), 401, "/problems/unauthorized");
});
