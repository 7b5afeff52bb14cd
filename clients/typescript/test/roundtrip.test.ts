// 1. A round trip of every method against a real `narad serve`, base64 payloads included; then
// every /v1 operation of the live OpenAPI document must have been called.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, GoneError, NaradError, OPERATIONS, type NaradMessage } from "@narad/client";
import { PASS, URL_, USER, client, sleep, uniqueTopic, until } from "./helpers.js";

const live = await (await fetch(`${URL_}/openapi.json`)).json();
const liveOps: Array<{ id: string; path: string }> = [];
for (const [path, item] of Object.entries(live.paths as Record<string, Record<string, { operationId?: string }>>)) {
  for (const [method, op] of Object.entries(item)) {
    if (["get", "put", "post", "patch", "delete"].includes(method) && op.operationId) liveOps.push({ id: op.operationId, path });
  }
}

const c = client();
const bytes = new Uint8Array([0, 255, 16, 1, 2, 3, 200, 128]);

async function expectError(p: Promise<unknown>, status: number, code: string): Promise<NaradError> {
  try {
    await p;
  } catch (thrown) {
    assert.ok(thrown instanceof NaradError, `expected a NaradError, got ${thrown}`);
    const e = thrown as NaradError;
    assert.equal(e.status, status, e.message);
    assert.equal(e.code, code, e.message);
    return e;
  }
  throw new Error(`expected ${status} ${code}, got a success`);
}

test("whoami", { skip: liveOps.some((o) => o.id === "whoami") ? false : "the server's /openapi.json has no whoami yet" }, async () => {
  const me = await c.whoami();
  assert.equal(me.user, USER);
  assert.ok(me.grants.some((g) => g.topics === "*" && g.actions.includes("admin")), JSON.stringify(me));
});

test("errors: 401 with a wrong password, NaradError with status and code", async () => {
  const bad = new Client({ baseUrl: URL_, user: USER, password: PASS + "-wrong" });
  await expectError(bad.getTopic("anything"), 401, "unauthorized");
});

test("round trips of every method", async () => {
  const topic = uniqueTopic("rt");

  // topics
  const created = await c.createTopic(topic, { partitions: 2, visibility_timeout_ms: 30_000 });
  assert.equal(created.created, true);
  assert.equal(created.name, topic);
  assert.equal(created.settings.partitions, 2);
  assert.equal((await c.createTopic(topic, { partitions: 2, visibility_timeout_ms: 30_000 })).created, false);
  await expectError(c.createTopic(topic, { partitions: 3 }), 409, "topic_exists");
  const changed = await c.changeTopic(topic, { visibility_timeout_ms: 60_000 });
  assert.equal(changed.settings.visibility_timeout_ms, 60_000);
  const got = await c.getTopic(topic);
  assert.equal(got.partitions.length, 2);
  assert.equal(got.settings.visibility_timeout_ms, 60_000);
  const page = await c.listTopics({ limit: 1000 });
  assert.ok(page.topics.some((t) => t.name === topic));
  const all: string[] = [];
  for await (const t of c.topics()) all.push(t.name);
  assert.ok(all.includes(topic));
  await expectError(c.getTopic(`${topic}-missing`), 404, "topic_not_found");

  // produce: JSON, keyed text, bytes into partition 1, headers, idempotency key
  const p1 = await c.produce(topic, { id: 1, total: 10.0 }, { partition: 0 });
  assert.deepEqual(p1, { partition: 0, offset: 0 });
  const p2 = await c.produce(topic, "hello world", { key: "customer-7", partition: 0, headers: { "trace-id": "abc" } });
  assert.equal(p2.offset, 1);
  const p3 = await c.produce(topic, bytes, { partition: 1 });
  assert.deepEqual(p3, { partition: 1, offset: 0 });
  const i1 = await c.produce(topic, "once", { idempotencyKey: "key-1", partition: 1 });
  const i2 = await c.produce(topic, "once", { idempotencyKey: "key-1", partition: 1 });
  assert.deepEqual(i2, i1);

  // replay: read-only, base64 decoded
  const r0 = await c.replay(topic, 0, 0);
  assert.deepEqual(r0.payload, { id: 1, total: 10 });
  assert.equal(r0.receipt_handle, undefined);
  const rb = await c.replay<Uint8Array>(topic, 1, 0);
  assert.equal(rb.payload_encoding, "base64");
  assert.ok(rb.payload instanceof Uint8Array);
  assert.deepEqual([...rb.payload], [...bytes]);
  const r1 = await c.replay(topic, 0, 1);
  assert.equal(r1.payload, "hello world");
  assert.equal(r1.key, "customer-7");
  assert.deepEqual(r1.headers, { "trace-id": "abc" });

  // consume (one), extend, ack; a second ack is 410 (GoneError, .gone)
  const m = (await c.consume(topic, { partition: 1, wait: 2000 }))!;
  assert.ok(m, "a message on partition 1");
  assert.equal(m.offset, 0);
  assert.deepEqual([...(m.payload as Uint8Array)], [...bytes]);
  assert.equal(m.delivery_count, 1);
  assert.ok(m.receipt_handle);
  await c.extend(topic, m.receipt_handle!);
  await c.ack(topic, m.receipt_handle!);
  const gone = await expectError(c.ack(topic, m.receipt_handle!), 410, "lease_gone");
  assert.ok(gone instanceof GoneError);
  assert.equal(gone.gone, true);
  assert.ok(gone.requestId);

  // nack: delivered again at once with delivery_count 2
  const n1 = (await c.consume(topic, { partition: 0, wait: "2s" }))!;
  assert.equal(n1.offset, 0);
  await c.nack(topic, n1.receipt_handle!);
  const n2 = (await c.consume(topic, { partition: 0, wait: "2s" }))!;
  assert.equal(n2.offset, 0);
  assert.equal(n2.delivery_count, 2);

  // retry later: not back within its delay
  await c.retryLater(topic, n2.receipt_handle!, "30s");
  const next = (await c.consume(topic, { partition: 0, wait: 1000 }))!;
  assert.equal(next.offset, 1, "offset 0 waits 30 s; offset 1 comes next");
  assert.equal(next.payload, "hello world");
  assert.deepEqual(next.headers, { "trace-id": "abc" });

  // consumeAcking: ack offset 1 and lease the next (partition 1, offset 1: "once")
  const acking = await c.consumeAcking(topic, [next.receipt_handle!], { partition: 1, wait: 1000 });
  assert.deepEqual(acking.acks, [{ status: 204 }]);
  assert.equal(acking.messages.length, 1);
  assert.equal(acking.messages[0].payload, "once");
  await c.ack(topic, acking.messages[0].receipt_handle!);

  // batches: produce-batch (bytes base64-encoded by the client), consume max, settle batch
  const results = await c.produceBatch(topic, [
    { payload: { id: 2 }, key: "k", partition: 1 },
    { payload: "plain text", partition: 1, headers: { h: "v" } },
    { payload: bytes, partition: 1 },
    { payload: [1, 2], partition: 1, idempotencyKey: "batch-1" },
  ]);
  assert.deepEqual(results.map((r) => r.status), [201, 201, 201, 201]);
  assert.deepEqual(results.map((r) => r.offset), [2, 3, 4, 5]);
  const batch = await c.consumeBatch(topic, 10, { partition: 1, wait: 2000 });
  assert.deepEqual(batch.map((b) => b.offset), [2, 3, 4, 5]);
  assert.deepEqual(batch[0].payload, { id: 2 });
  assert.equal(batch[0].key, "k");
  assert.equal(batch[1].payload, "plain text");
  assert.deepEqual(batch[1].headers, { h: "v" });
  assert.ok(batch[2].payload instanceof Uint8Array);
  assert.deepEqual([...(batch[2].payload as Uint8Array)], [...bytes]);
  assert.deepEqual(batch[3].payload, [1, 2]);
  const handles = batch.map((b) => b.receipt_handle!);
  assert.deepEqual((await c.settleBatch(topic, handles, { extend: true })).map((r) => r.status), [204, 204, 204, 204]);
  assert.deepEqual((await c.settleBatch(topic, handles)).map((r) => r.status), [204, 204, 204, 204]);
  const again = await c.settleBatch(topic, handles);
  assert.deepEqual(again.map((r) => r.status), [410, 410, 410, 410]);
  assert.equal(again[0].error?.code, "lease_gone");
  assert.deepEqual(await c.consumeBatch(topic, 10, { partition: 1, wait: 0 }), []);
  assert.equal(await c.consume(topic, { partition: 1, wait: 0 }), null);

  // delay and cancel
  const delayed = await c.produce(topic, "later", { delay: "1h", partition: 0 });
  assert.equal((await c.getTopic(topic)).partitions[0].delayed, 1);
  await c.cancelMessage(topic, delayed.partition, delayed.offset);
  assert.equal((await c.getTopic(topic)).partitions[0].delayed, 0);
  await expectError(c.cancelMessage(topic, 0, 999_999), 404, "message_not_found");
  const delayedMs = await c.produce(topic, "soon", { delay: 300, partition: 0 });
  const soon = await until("the 300 ms delayed message", 5000, async () => (await c.consume(topic, { partition: 0, wait: 1000 })) ?? undefined);
  assert.equal(soon.offset, delayedMs.offset);
  await c.ack(topic, soon.receipt_handle!);

  // subscriptions
  const sub = await c.createSubscription(topic, "billing", { visibility_timeout_ms: 20_000 });
  assert.equal(sub.created, true);
  assert.equal(sub.effective.visibility_timeout_ms, 20_000);
  assert.equal((await c.createSubscription(topic, "billing", { visibility_timeout_ms: 20_000 })).created, false);
  const patched = await c.patchSubscription(topic, "billing", { visibility_timeout_ms: 25_000 });
  assert.equal(patched.effective.visibility_timeout_ms, 25_000);
  assert.equal((await c.getSubscription(topic, "billing")).settings.visibility_timeout_ms, 25_000);
  assert.ok((await c.listSubscriptions(topic)).subscriptions.some((s) => s.name === "billing"));
  await c.produce(topic, "fan-out", { partition: 0 });
  const viaSub = (await c.consume(topic, { subscription: "billing", wait: 2000 }))!;
  assert.equal(viaSub.payload, "fan-out");
  await c.ack(topic, viaSub.receipt_handle!);
  await expectError(c.consume(topic, { subscription: "nope", wait: 0 }), 404, "subscription_not_found");
  assert.deepEqual(await c.purgeTopic(topic, { subscription: "billing" }), { purged: 0 });
  await c.deleteSubscription(topic, "billing");
  await expectError(c.getSubscription(topic, "billing"), 404, "subscription_not_found");

  // purge: every retained message; outstanding handles then 410
  const held = (await c.consume(topic, { wait: 1000 }))!;
  assert.ok(held);
  const purged = await c.purgeTopic(topic);
  assert.ok(purged.purged >= 1, JSON.stringify(purged));
  await assert.rejects(c.ack(topic, held.receipt_handle!), (e: unknown) => e instanceof GoneError);
  await expectError(c.replay(topic, 0, 0), 410, "offset_expired");

  await c.deleteTopic(topic);
  await expectError(c.getTopic(topic), 404, "topic_not_found");
});

test("redrive: a dead letter goes back to its topic", async () => {
  const topic = uniqueTopic("rd");
  const dlq = `${topic}-dlq`;
  await c.createTopic(dlq);
  await c.createTopic(topic, { max_deliveries: 1, dead_letter_topic: dlq });
  await c.produce(topic, { job: "poison" });
  const m = (await c.consume(topic, { wait: 2000 }))!;
  await c.nack(topic, m.receipt_handle!);
  // The second delivery would pass max_deliveries: the message moves to the dead-letter topic.
  const dead = await until<NaradMessage>("the dead letter", 10_000, async () => (await c.consume(topic, { wait: 200 })) ?? (await c.replay(dlq, 0, 0).catch(() => undefined)));
  assert.deepEqual(dead.payload, { job: "poison" });
  assert.equal(dead.topic, dlq, `the message went to ${dead.topic}`);
  assert.equal(dead.headers?.["narad-source-topic"], topic);
  const moved = await c.redrive(dlq, { max: 10 });
  assert.deepEqual(moved, { moved: 1, failed: 0 });
  const back = (await c.consume(topic, { wait: 2000 }))!;
  assert.deepEqual(back.payload, { job: "poison" });
  await c.ack(topic, back.receipt_handle!);
  await c.deleteTopic(topic);
  await c.deleteTopic(dlq);
});

test("every /v1 operation of the live document was called by these round trips", async (t: any) => {
  // Runs last (tests in a file run in order).
  const missing = liveOps.filter((o) => o.path.startsWith("/v1/") && !c.calledOperations.has(o.id as keyof typeof OPERATIONS)).map((o) => o.id);
  if (missing.length === 1 && missing[0] === "whoami") t.diagnostic("whoami not called");
  assert.deepEqual(missing, [], `operations never called: ${missing.join(", ")}`);
  void sleep;
});
